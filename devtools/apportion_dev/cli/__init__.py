"""The harness's `apportion` subcommands, plugged in through the `apportion.commands` entry
points: dev-cluster, demo, demo-worker, demo-traffic."""
