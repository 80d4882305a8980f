"""What the wheel ships besides the code: man pages, dashboard and alert rules, units, schemas.

Built here with hatchling, the build backend (pyproject.toml), as pip builds it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built)


def _data(wheel: zipfile.ZipFile) -> str:
    """The wheel's ``NAME-VERSION.data/data/`` prefix (pip installs it under the prefix)."""
    (dist_info,) = {n.split("/")[0] for n in wheel.namelist() if ".dist-info/" in n}
    return dist_info.removesuffix(".dist-info") + ".data/data/"


def test_the_man_pages_are_in_share_man(wheel: zipfile.ZipFile) -> None:
    for name in ("man1/agentscope.1", "man8/agentscope-generator.8"):
        shipped = wheel.read(f"{_data(wheel)}share/man/{name}")
        assert shipped == (ROOT / "man" / name).read_bytes()


def test_the_dashboard_and_alert_rules_are_package_data(wheel: zipfile.ZipFile) -> None:
    for name in ("agentscope.json", "alerts.yml"):
        (shipped,) = [n for n in wheel.namelist() if n.endswith(f"/_dashboards/{name}")]
        assert wheel.read(shipped) == (ROOT / "dashboards" / name).read_bytes()
        # Next to the package's code, as the units and the schemas are.
        package = shipped.split("/")[0]
        assert f"{package}/__init__.py" in wheel.namelist()
    assert not [n for n in wheel.namelist() if "alerts_test" in n or "/sample/" in n]
