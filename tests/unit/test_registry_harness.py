"""The dev-cluster's registries without starting them: the registry's build and configuration,
the mirror containerd reads, the names pushed, the state kept, and the package index the dist
server makes (served for real on a loopback port). With real clients: tests/e2e/test_registry.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from apportion_dev.devcluster import distserver, registry
from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.realnode.node import NodePaths, _containerd_config
from apportion_dev.devcluster.state import ClusterState, Layout, claim, load_state, save_state
from apportion_dev.devcluster.tools import REGISTRY, TEST_TOOLS, tool_build


def test_the_registry_is_built_at_the_pinned_distribution_version() -> None:
    build = tool_build(REGISTRY)
    assert REGISTRY in TEST_TOOLS
    assert build.targets == ("github.com/distribution/distribution/v3/cmd/registry",)
    assert build.directory.name == f"registry-{build.stamp['registry']}"
    ldflags = build.ldflags("2026-01-01T00:00:00Z")
    assert ldflags == [
        f"-X github.com/distribution/distribution/v3/version.version={build.stamp['registry']}"
    ]


def test_the_config_keeps_storage_in_the_state_directory(tmp_path: Path) -> None:
    config = yaml.safe_load(registry.write_config(tmp_path / "r", "127.0.0.1", 5123).read_text())
    assert config["http"]["addr"] == "127.0.0.1:5123"
    assert config["storage"]["filesystem"]["rootdirectory"] == str(tmp_path / "r" / "storage")


@pytest.mark.parametrize(
    ("published", "path"),
    [
        ("ghcr.io/apportion/apportion:1.2.3", "apportion/apportion:1.2.3"),
        ("ghcr.io/apportion/apportion-demo:1.2.3", "apportion/apportion-demo:1.2.3"),
        ("localhost:5000/a/b@sha256:00", "a/b@sha256:00"),
    ],
)
def test_a_published_name_keeps_its_repository_path(published: str, path: str) -> None:
    assert registry.repository_path(published) == path


@pytest.mark.parametrize("name", ["apportion/apportion:1", "apportion:1"])
def test_a_name_without_a_registry_host_is_refused(name: str) -> None:
    with pytest.raises(DevClusterError):
        registry.repository_path(name)


def test_containerd_reads_a_mirror_for_the_published_host(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    registry.write_mirrors(hosts, "10.244.0.1:5123")
    mirror = tomllib.loads((hosts / "ghcr.io" / "hosts.toml").read_text())
    assert mirror == {
        "server": "https://ghcr.io",
        "host": {"http://10.244.0.1:5123": {"capabilities": ["pull", "resolve"]}},
    }
    node = NodePaths(tmp_path / "node")
    with_mirror = tomllib.loads(_containerd_config(node, hosts))
    images = with_mirror["plugins"]["io.containerd.cri.v1.images"]
    assert images["registry"] == {"config_path": str(hosts)}
    without = tomllib.loads(_containerd_config(node))
    assert "registry" not in without["plugins"]["io.containerd.cri.v1.images"]
    # Everything else is the same configuration.
    del images["registry"]
    assert with_mirror == without


def test_state_keeps_the_registries_and_reads_a_state_from_before_them(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "dc")
    claim(layout)
    state = ClusterState(
        "https://127.0.0.1:1", "t", "/b", [], "127.0.0.1:2", "/dist", "http://127.0.0.1:3"
    )
    save_state(layout, state)
    assert load_state(layout) == state
    older = json.loads(layout.state_file.read_text())
    for key in ("registry", "dist", "dist_server"):
        del older[key]
    layout.state_file.write_text(json.dumps(older))
    assert load_state(layout) == ClusterState("https://127.0.0.1:1", "t", "/b", [])


@pytest.mark.parametrize(
    ("filename", "project"),
    [
        ("apportion-1.0.0-py3-none-any.whl", "apportion"),
        ("apportion_devtools-0.2.0rc1-py3-none-any.whl", "apportion-devtools"),
        ("apportion_devtools-0.2.0.tar.gz", "apportion-devtools"),
        ("Apportion.Kafka-1.0.zip", "apportion-kafka"),
        ("SHA256SUMS", None),
        ("apportion-1.0.0.tar.gz.asc", None),
    ],
)
def test_distribution_files_are_grouped_by_normalized_project(
    filename: str, project: str | None
) -> None:
    assert distserver.project_of(filename) == project


@pytest.fixture
def dist_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    dist = tmp_path / "dist"
    (dist / "python").mkdir(parents=True)
    (dist / "maven" / "g" / "a" / "1").mkdir(parents=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(distserver.Handler, dist=dist))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", dist
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def test_the_index_links_every_file_of_a_project_with_its_sha256(
    dist_server: tuple[str, Path],
) -> None:
    url, dist = dist_server
    wheel = dist / "python" / "apportion_devtools-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    (dist / "python" / "apportion-1.0.tar.gz").write_bytes(b"sdist")
    assert re.findall(r'href="([^"]+)"', _get(f"{url}/simple/")[1].decode()) == [
        "apportion/",
        "apportion-devtools/",
    ]
    page = _get(f"{url}/simple/apportion-devtools/")[1].decode()
    (link,) = re.findall(r'href="([^"]+)"', page)
    assert link == f"../../files/{wheel.name}#sha256={hashlib.sha256(b'wheel').hexdigest()}"
    resolved = urllib.parse.urljoin(f"{url}/simple/apportion-devtools/", link.split("#")[0])
    assert _get(resolved) == (200, b"wheel")
    # Added after start: shown at once.
    (dist / "python" / "apportion-1.1.tar.gz").write_bytes(b"newer")
    assert "apportion-1.1.tar.gz" in _get(f"{url}/simple/apportion/")[1].decode()
    assert _get(f"{url}/simple/nothing-here/")[0] == 404
    assert _get(f"{url}/simple/Apportion/")[0] == 404  # PEP 503: clients ask normalized names


def test_the_maven_repository_serves_files_and_nothing_else(
    dist_server: tuple[str, Path],
) -> None:
    url, dist = dist_server
    (dist / "maven" / "g" / "a" / "1" / "a-1.pom").write_text("<project/>")
    (dist / "SHA256SUMS").write_text("secret-ish")
    assert _get(f"{url}/maven/g/a/1/a-1.pom") == (200, b"<project/>")
    assert _get(f"{url}/maven/g/a/1/")[0] == 404  # no listings
    assert _get(f"{url}/maven/../SHA256SUMS")[0] == 404
    assert _get(f"{url}/SHA256SUMS")[0] == 404
    assert _get(f"{url}/maven/g/a/1/a-2.pom")[0] == 404
