"""What `pip install apportion` installs: the product, none of the harness (devtools/), which
plugs its commands in through entry points when it is installed beside it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS = ("devcluster/", "apportion_dev", "worker/demo.py", "worker/traffic.py", "grains/demo.py")


def test_the_product_wheel_holds_no_harness(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--wheel-dir", str(tmp_path), str(REPO)], check=True)
    (wheel,) = tmp_path.glob("apportion-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "apportion/engine/set_pass.py" in names  # the product is there
    assert [n for n in names if any(part in n for part in HARNESS)] == []
    (entry_points,) = [n for n in names if n.endswith("entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "apportion.commands" not in text
    assert "dev-cluster" not in text
