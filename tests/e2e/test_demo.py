"""`apportion demo` (what `make demo` runs) from start to finish on its own dev-cluster: the
samples become Balanced over every worker, the user is told what to run, and everything it
started is gone after it exits."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def run_demo(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "apportion", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def processes_using(path: str) -> list[str]:
    """Command lines of live processes whose environment or arguments mention `path`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if path.encode() in cmdline or path.encode() in environ:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_demo_runs_the_samples_until_balanced_then_stops_everything() -> None:
    result = run_demo("--exit-after-ready")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "partitionset/demo: Ready=True Balanced=True, 4 of 4 members" in output
    assert "shardset/carts: Ready=True Balanced=True, 3 of 3 members" in output
    assert "apportion demo is ready. In another shell:" in output
    kubeconfig = re.search(r"export KUBECONFIG=(\S+)", output)
    assert kubeconfig, output
    for command in (
        "kubectl get apportion",
        "kubectl describe partitionset demo",
        "kubectl get configmap demo-partitionset-assignment -o jsonpath=",
        "kubectl scale statefulset demo-workers --replicas=5",
        "locate --scheme netherite --count 32",
    ):
        assert command in output
    assert re.search(r"curl http://127\.\d+\.\d+\.\d+:8080/key/order-17", output)
    # Gone after the exit: state directory, operator, control plane and worker processes.
    state_dir = str(Path(kubeconfig[1]).parent)
    assert not Path(state_dir).exists()
    assert processes_using(state_dir) == []


def test_a_kubeconfig_that_does_not_answer_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    result = run_demo("--kubeconfig", str(config), timeout=120)
    assert result.returncode == 1
    assert f"the cluster of {config} does not answer" in result.stderr
