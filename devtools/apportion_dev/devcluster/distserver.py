"""A Python package index and a Maven repository over a release's `dist/` (`apportion dev-cluster
start --dist DIR`), on loopback, plain HTTP, one threaded server:

  /simple/            a PEP 503 "simple" index of dist/python's wheels and sdists, with sha256
                      fragments, made on each request (a release rebuilt in place shows at once)
  /files/             dist/python's files, which the index links
  /maven/             dist/maven as files: a Maven repository is its directory layout

Loopback, because pip and Maven treat it as a secure origin over HTTP: `pip --index-url` needs no
`--trusted-host`, and Maven's `external:http:*` blocker leaves 127.0.0.1 alone.

    python -m apportion_dev.devcluster.distserver --dist DIR --address 127.0.0.1 --port P
"""

from __future__ import annotations

import argparse
import hashlib
import html
import re
import signal
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

INDEX = "/simple/"
FILES = "/files/"  # dist/python's files, outside the index so that no project name clashes
MAVEN = "/maven/"
_DISTRIBUTION = re.compile(r"^(?P<name>.+?)-\d[^-]*(?:-.*)?\.(?:whl|tar\.gz|zip)$")


def normalize(name: str) -> str:
    """PEP 503's project name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str | None:
    """The normalized project of a wheel or sdist file name (`apportion_devtools-1.0-py3-...whl`
    → `apportion-devtools`), None for other files."""
    match = _DISTRIBUTION.match(filename)
    return normalize(match.group("name")) if match else None


def projects(python: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for path in sorted(python.glob("*")) if python.is_dir() else ():
        project = project_of(path.name)
        if project is not None and path.is_file():
            found.setdefault(project, []).append(path)
    return found


def _page(title: str, links: list[tuple[str, str]]) -> bytes:
    anchors = "\n".join(f'<a href="{html.escape(h)}">{html.escape(t)}</a><br>' for h, t in links)
    return (
        f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{html.escape(title)}</title></head><body>\n{anchors}\n</body></html>\n"
    ).encode()


def root_page(python: Path) -> bytes:
    return _page("Simple index", [(f"{p}/", p) for p in projects(python)])


def project_page(python: Path, project: str) -> bytes | None:
    files = projects(python).get(project)
    if files is None:
        return None
    links = [
        (f"../..{FILES}{f.name}#sha256={hashlib.sha256(f.read_bytes()).hexdigest()}", f.name)
        for f in files
    ]
    return _page(f"Links for {project}", links)


class Handler(SimpleHTTPRequestHandler):
    """Index pages from `dist/python`, its files below /files/, and `dist/maven`."""

    def __init__(self, *args: object, dist: Path, **kwargs: object) -> None:
        self.dist = dist
        super().__init__(*args, directory=str(dist), **kwargs)  # type: ignore[arg-type]

    def _route(self) -> tuple[bytes | None, str | None]:
        """(index page, None), or (None, file path relative to dist), or (None, None): 404."""
        path = unquote(urlsplit(self.path).path)
        python = self.dist / "python"
        if path == INDEX:
            return root_page(python), None
        if path.startswith(FILES):
            name = path.removeprefix(FILES)
            return None, f"python/{name}" if "/" not in name else None
        if path.startswith(INDEX):
            project = path.removeprefix(INDEX).strip("/")
            if project != normalize(project):
                return None, None
            return project_page(python, project), None
        if path.startswith(MAVEN):
            return None, "maven/" + path.removeprefix(MAVEN)
        return None, None

    def _serve(self, head: bool) -> None:
        page, relative = self._route()
        if page is not None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if not head:
                self.wfile.write(page)
            return
        if relative is None or ".." in Path(relative).parts:
            self.send_error(404)
            return
        self.path = "/" + relative
        if head:
            super().do_HEAD()
        else:
            super().do_GET()

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def list_directory(self, path: str | bytes) -> None:  # type: ignore[override]
        self.send_error(404)  # Maven and pip ask for files; no listings
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="apportion_dev.devcluster.distserver")
    parser.add_argument("--dist", type=Path, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(
        (args.address, args.port), partial(Handler, dist=args.dist.resolve())
    )
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    print(f"serving {args.dist} on http://{args.address}:{args.port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
