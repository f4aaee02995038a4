"""The admin token and the service-account signing key, made fresh for every cluster.

The key comes from the `openssl` command line rather than a Python crypto dependency: it is
present wherever Go builds Kubernetes, and one RSA private key serves both the API server's
signing and verification flags and the controller-manager's token signing.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path

from apportion_dev.devcluster.paths import DevClusterError

ADMIN_USER = "admin"
ADMIN_GROUP = "system:masters"


def new_token() -> str:
    return secrets.token_hex(24)


def token_auth_line(token: str) -> str:
    """One line of kube-apiserver's --token-auth-file: token,user,uid,"group1,group2"."""
    return f'{token},{ADMIN_USER},{ADMIN_USER}-uid,"{ADMIN_GROUP}"\n'


def write_token_file(path: Path, token: str) -> None:
    path.write_text(token_auth_line(token))
    path.chmod(0o600)


def write_service_account_key(path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise DevClusterError("`openssl` is not on PATH; it generates the service-account key")
    result = subprocess.run(
        [
            openssl,
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(f"openssl could not generate a key: {result.stderr.strip()}")
    path.chmod(0o600)
