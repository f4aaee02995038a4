"""A Git server on loopback for GitOps tests: bare repositories under a directory, served
read-only over smart HTTP by `git http-backend` (run as a CGI program per request) behind a
small `http.server` running in a thread of the calling process.

go-git, which Flux's source-controller uses, speaks smart HTTP only, so a static file server
over a bare repository (dumb HTTP) would not do. Pushes go to the bare repository over the
file system (`Repository.commit`), so the server never accepts a push.

    with GitServer(tmp_path / "git") as server:
        repo = server.create("app")            # bare app.git + a work tree to commit in
        repo.write("deploy/kustomization.yaml", "...")
        sha = repo.commit("first")             # commit and push to the bare repository
        server.url("app")                      # http://127.0.0.1:PORT/app.git
"""

from __future__ import annotations

import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

BRANCH = "main"
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "apportion e2e",
    "GIT_AUTHOR_EMAIL": "e2e@apportion.dev",
    "GIT_COMMITTER_NAME": "apportion e2e",
    "GIT_COMMITTER_EMAIL": "e2e@apportion.dev",
}


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,  # no user config: no signing, hooks or templates
        **_GIT_IDENTITY,
    }
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the CGI output is not chunked: close after each response
    server: _Server

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.server.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.0",
        }
        for name, value in self.headers.items():  # Git-Protocol (v2), Content-Encoding (gzip)
            env["HTTP_" + name.upper().replace("-", "_")] = value
        proc = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        )
        head, separator, payload = proc.stdout.partition(b"\r\n\r\n")
        if not separator:
            head, _, payload = proc.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        if proc.returncode != 0 and not proc.stdout:
            status = 500
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.server.requests += 1

    do_GET = do_POST = _cgi

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.requests = 0


class Repository:
    """A bare repository the server serves and a work tree beside it to commit in."""

    def __init__(self, bare: Path, work: Path) -> None:
        self.bare, self.work = bare, work

    def write(self, path: str, text: str) -> None:
        target = self.work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def remove(self, path: str) -> None:
        (self.work / path).unlink()

    def commit(self, message: str) -> str:
        """Commit everything in the work tree and push it to the bare repository; the sha."""
        _git("add", "-A", cwd=self.work)
        _git("commit", "--quiet", "--allow-empty", "-m", message, cwd=self.work)
        _git("push", "--quiet", "origin", BRANCH, cwd=self.work)
        return _git("rev-parse", "HEAD", cwd=self.work)


class GitServer:
    """Serves the bare repositories `<name>.git` under `root` on a free loopback port."""

    def __init__(self, root: Path) -> None:
        self.root = root / "srv"
        self.root.mkdir(parents=True, exist_ok=True)
        self._work = root / "work"
        self._server = _Server(self.root)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="git-http", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def requests(self) -> int:
        """How many requests were answered (a fetch is two or three)."""
        return self._server.requests

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}.git"

    def create(self, name: str) -> Repository:
        bare = self.root / f"{name}.git"
        _git("init", "--quiet", "--bare", f"--initial-branch={BRANCH}", str(bare))
        work = self._work / name
        _git("clone", "--quiet", str(bare), str(work))
        _git("checkout", "--quiet", "-B", BRANCH, cwd=work)
        return Repository(bare, work)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> GitServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
