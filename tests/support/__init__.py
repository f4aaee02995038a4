"""Helpers shared by the test tiers and the benchmarks (bench/ imports them as
`tests.support.*`; run a benchmark from the repository root as `python -m bench.bench_NAME`)."""
