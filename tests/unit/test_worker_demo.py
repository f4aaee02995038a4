"""The demo worker's synthetic load (profiles, request rates) and its command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from apportion.worker.demo import LoadProfile, RequestRates


def test_profiles_give_each_unit_the_same_load_on_every_worker() -> None:
    rates = RequestRates()
    assert LoadProfile.parse("uniform").load("7", rates) == 1.0
    assert LoadProfile.parse("uniform:2.5").load("7", rates) == 2.5
    zipf = LoadProfile.parse("zipf")
    assert [zipf.load(u, rates) for u in ("0", "1", "3")] == [100.0, 50.0, 25.0]
    assert LoadProfile.parse("zipf:2").load("1", rates) == 25.0
    units = LoadProfile.parse("units:0=50,3=20")
    assert [units.load(u, rates) for u in ("0", "1", "3")] == [50.0, 1.0, 20.0]
    assert LoadProfile.parse("units:0=50,*=0").load("1", rates) == 0.0
    assert LoadProfile.parse("none").reports is False
    assert LoadProfile.parse("requests").reports is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gaussian", "unknown load profile 'gaussian'"),
        ("uniform:-1", "must be a finite number >= 0"),
        ("zipf:x", "is not a number"),
        ("units:", "at least one UNIT=VALUE"),
        ("units:3", "expected UNIT=VALUE"),
        ("units:3=inf", "must be a finite number >= 0"),
        ("none:1", "takes no argument"),
    ],
)
def test_bad_profiles_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadProfile.parse(text)


def test_request_rates_count_the_last_window_per_unit() -> None:
    rates = RequestRates(window=10)
    for second in (100.2, 100.7, 101.0, 105.5):
        rates.count("3", now=second)
    rates.count("4", now=100.0)
    assert rates.rate("3", now=105.9) == 0.4
    assert rates.rate("3", now=110.5) == 0.2  # seconds 100 and 101 left the window
    assert rates.rate("4", now=111.0) == 0.0
    assert rates.rate("5", now=100.0) == 0.0
    rates.forget("3")
    assert rates.rate("3", now=106.0) == 0.0


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apportion", "demo-worker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_command_line_errors_name_the_problem() -> None:
    missing = run("--kind", "PartitionSet")
    assert missing.returncode == 2 and "--kind and --set are required" in missing.stderr
    both = run("--grains", "--set", "demo")
    assert both.returncode == 2 and "leave out --kind and --set" in both.stderr
    profile = run("--kind", "ShardSet", "--set", "s", "--load-profile", "zipf:-2")
    assert profile.returncode == 2 and "--load-profile: load value '-2'" in profile.stderr
    no_pod = run("--kind", "ShardSet", "--set", "s", env={"PATH": "/usr/bin:/bin"})
    assert no_pod.returncode == 1 and "POD_NAME is not set" in no_pod.stdout
