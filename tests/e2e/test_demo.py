"""`make demo` from start to finish as a user runs it, in a terminal, on its own dev-cluster: the
three kinds become Ready under the load generator's traffic, the PartitionSet balances on that
load, the user is told what to run, and Ctrl-C ends it with status 0 and nothing left over."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster.realnode.images import published_names

REPO = Path(__file__).resolve().parents[2]


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


def fnv1a_32(key: str) -> int:
    """FNV-1a, 32 bits (the reference constants), written here apart from apportion's kernel."""
    h = 0x811C9DC5
    for byte in key.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


class Terminal:
    """`make demo` as a user runs it: in a terminal (a pty that is the process's controlling
    terminal), where Ctrl-C is a byte the line discipline turns into SIGINT for the foreground
    process group."""

    def __init__(self, *command: str) -> None:
        self.master, slave = pty.openpty()

        def controlling_terminal() -> None:
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self.process = subprocess.Popen(
            command,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=REPO,
            env=env,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.output = b""

    def read_until(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.output:
            ended = self._read(1.0) < 0 and self.process.poll() is not None
            if ended or time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in:\n{self.text[-3000:]}")
        return self.text

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def stop(self) -> None:
        """After a failed check: close the terminal, as a user closing the window would (the
        kernel sends SIGHUP to its foreground process group, the demo, which then stops
        everything it started), then SIGKILL whatever is left of make's process group."""
        os.close(self.master)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self._read(0.5)
        while self._read(0.2) > 0:
            pass
        return self.process.wait(timeout=5)

    def _read(self, timeout: float) -> int:
        """Bytes read within `timeout` (0: none came), -1 once the terminal is closed."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return 0
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # the other side closed: the process and its children are gone
            return -1
        self.output += chunk
        return len(chunk) or -1

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.one_per_machine  # on a real node where the machine has one (root on Linux)
def test_make_demo_runs_three_kinds_under_traffic_and_ctrl_c_stops_it_cleanly() -> None:
    terminal = Terminal("make", "--no-print-directory", "demo")
    try:
        output = terminal.read_until("Ctrl-C stops everything", timeout=600)
        for line in (
            "partitionset/demo: Ready=True Balanced=True, 4 of 4 members",
            "shardset/carts: Ready=True Balanced=True, 3 of 3 members",
            "graintype/cart: Ready=True, 3 members",
            "graintype/report: Ready=True, 4 members",
        ):
            assert line in output
        for command in (
            "kubectl get pods -n apportion-system -o wide",
            "kubectl top pods",
            "kubectl get apportion",
            "kubectl get graintypes",
            "kubectl get configmap cart-placement -o jsonpath=",
            "explain grain cart cart-17",
            "kubectl patch configmap demo-traffic",
            "kubectl scale statefulset demo-workers --replicas=5",
        ):
            assert command in output
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", output)
        assert kubeconfig, output
        state_dir = Path(kubeconfig[1]).parent
        kubectl_dir = re.search(r"export PATH=(\S+?):", output)
        assert kubectl_dir, output
        demo = Demo(Path(kubeconfig[1]), Path(kubectl_dir[1]))
        # CI runs as root on Linux: the demo runs on a real node, the operator as containers.
        assert "starting a local dev-cluster with a real node" in output
        demo.check_operator_runs_from_its_manifests()
        demo.check_three_kinds_under_traffic()
        demo.check_hot_partition_is_relieved()
        terminal.ctrl_c()
        status = terminal.wait(timeout=120)
    finally:
        terminal.stop()
    assert status == 0, terminal.text[-3000:]
    assert terminal.text.rstrip().endswith(
        "[demo] stopped on request: the operator, the workers and the cluster are gone"
    ), terminal.text[-3000:]
    assert "Error" not in terminal.text.split("Ctrl-C stops everything")[-1]
    # Gone after the exit: state directory, operator, control plane and worker processes.
    assert not state_dir.exists()
    assert processes_using(str(state_dir)) == []


class Demo:
    """What a user looks at with kubectl while the demo runs."""

    def __init__(self, kubeconfig: Path, kubectl_dir: Path) -> None:
        self.kubeconfig, self.kubectl_dir = kubeconfig, kubectl_dir

    def get(self, *what: str) -> Any:
        result = subprocess.run(
            [
                str(self.kubectl_dir / "kubectl"),
                f"--kubeconfig={self.kubeconfig}",
                "get",
                *what,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(result.stdout)

    def until(self, check: Callable[[], str | None], timeout: float) -> None:
        """Polls `check` (None: holds, else what is still missing) until it holds."""
        deadline = time.monotonic() + timeout
        while (missing := check()) is not None:
            assert time.monotonic() < deadline, missing
            time.sleep(2)

    def kubectl(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.kubectl_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return result.stdout

    def check_operator_runs_from_its_manifests(self) -> None:
        pods = self.get("pods", "-n", "apportion-system")["items"]
        assert len(pods) == 2
        for pod in pods:
            # The spec's name: the status reports one of the names the node gave the image.
            (container,) = pod["spec"]["containers"]
            assert container["image"] == published_names()[0]  # the operator's, as manifests/ say
            (status,) = pod["status"]["containerStatuses"]
            assert status["ready"] is True

    def check_three_kinds_under_traffic(self) -> None:
        def three_kinds_ready_and_loaded() -> str | None:
            found = self.get("apportion")["items"]
            kinds = Counter(item["kind"] for item in found)
            if kinds != {"PartitionSet": 1, "ShardSet": 1, "GrainType": 2}:
                return f"kinds: {kinds}"
            for item in found:
                conditions = {c["type"]: c for c in item["status"].get("conditions", ())}
                name = f"{item['kind']}/{item['metadata']['name']}"
                if conditions.get("Ready", {}).get("status") != "True":
                    return f"{name} not Ready: {conditions.get('Ready')}"
                if conditions.get("Degraded", {}).get("status") == "True":
                    return f"{name} Degraded: {conditions['Degraded']}"
            pset = next(i for i in found if i["kind"] == "PartitionSet")
            if pset["status"].get("metricsSource") in (None, "Counts"):
                return f"PartitionSet balanced on {pset['status'].get('metricsSource')}"
            loads = [float(row["load"]) for row in pset["status"].get("memberUnits", ())]
            if sum(loads) < 5:
                return f"no traffic on the partitions yet: {loads}"
            return None

        self.until(three_kinds_ready_and_loaded, timeout=180)
        # Workers report no unit's load before they own one: that is no fault to warn about.
        warnings = self.get("events", "--field-selector", "type=Warning")["items"]
        assert [e["message"] for e in warnings if e["reason"] == "MetricsUnavailable"] == []
        # Grain activations spread over the web silos by ActivationCountBased: each has some.
        silos = {
            pod["metadata"]["name"]: pod
            for pod in self.get("pods", "-l", "app=grain-silos,apportion.dev/role=web")["items"]
        }

        def every_web_silo_hosts_carts() -> str | None:
            table = self.get("configmap", "cart-placement")["data"]["placement.json"]
            counts = {
                m["name"]: (m.get("stats") or {}).get("activationCount", 0)
                for m in json.loads(table)["members"]
            }
            if set(counts) != set(silos) or min(counts.values()) == 0:
                return f"cart activations per silo: {counts}"
            return None

        self.until(every_web_silo_hosts_carts, timeout=120)

        def the_generator_reports_answered_requests() -> str | None:
            text = self.kubectl("logs", "deployment/demo-traffic")
            served = [int(n) for n in re.findall(r"requests, (\d+) ok", text)]
            return None if served and max(served) > 0 else f"traffic log: {text[-1500:]}"

        self.until(the_generator_reports_answered_requests, timeout=60)

    def check_hot_partition_is_relieved(self) -> None:
        """With skew 2 the hottest key draws 1/zeta(2) = 61 % of the partition traffic, more
        than a pod's fair share (25 %): Balanced moves the other partitions off its pod until
        the pod is within the sample's 20 % tolerance of that partition's load, which leaves it
        far fewer partitions than the 8 a count-based placement gives every pod."""
        subprocess.run(
            [
                str(self.kubectl_dir / "kubectl"),
                f"--kubeconfig={self.kubeconfig}",
                "patch",
                "configmap",
                "demo-traffic",
                "--type",
                "merge",
                "-p",
                '{"data": {"skew": "2"}}',
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        hot = str(fnv1a_32("demo-0") % 32)

        def hot_partition_relieved() -> str | None:
            table = json.loads(
                self.get("configmap", "demo-partitionset-assignment")["data"]["assignments.json"]
            )
            assert table["layout"] == "map", table["layout"]
            owner = table["units"][hot]
            beside = sorted(u for u, pod in table["units"].items() if pod == owner and u != hot)
            fair = 32 // len(set(table["units"].values()))
            return None if len(beside) + 1 < fair / 2 else f"{owner} serves {beside} beside {hot}"

        self.until(hot_partition_relieved, timeout=240)


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
