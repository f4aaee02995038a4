"""Loopback ports and the small HTTPS GETs the harness needs before any client is configured."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now. Another process can take it before we bind it, so
    callers retry a start that fails with "address already in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct free ports: all sockets stay open until every port is chosen."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def http_get(
    url: str,
    *,
    token: str | None = None,
    ca_file: Path | None = None,
    timeout: float = 2.0,
) -> tuple[int, str]:
    """GET `url`; (status, body), with status 0 when nothing answered."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    # No proxy handler: everything here is loopback, whatever http(s)_proxy says.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (OSError, ssl.SSLError):
        return 0, ""


def http_get_json(url: str, **kwargs: Any) -> Any | None:
    status, body = http_get(url, **kwargs)
    if status != 200:
        return None
    return json.loads(body)
