"""The launch gate's build: the wheel's build hook and ``AGENTSCOPE_BUILD_GATE``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from native import build_gate

ROOT = Path(__file__).resolve().parents[1]


def _interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file names a program interpreter (PT_INTERP)."""
    assert elf[:4] == b"\x7fELF"
    phoff = int.from_bytes(elf[32:40], "little")
    size, count = int.from_bytes(elf[54:56], "little"), int.from_bytes(elf[56:58], "little")
    types = [
        int.from_bytes(elf[phoff + i * size : phoff + i * size + 4], "little") for i in range(count)
    ]
    return 3 in types  # PT_INTERP


def test_none_builds_nothing(tmp_path: Path) -> None:
    assert build_gate.build(tmp_path / "gate", "none") is None
    assert not (tmp_path / "gate").exists()


def test_an_unknown_choice_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(build_gate.GateBuildError, match="auto, static, none"):
        build_gate.build(tmp_path / "gate", "yes")


def test_without_a_compiler_auto_says_so_and_static_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CC", "/bin/false")
    assert build_gate.build(tmp_path / "gate", "auto") is None
    assert "will run in Python" in capsys.readouterr().err
    with pytest.raises(build_gate.GateBuildError, match="libc6-dev"):
        build_gate.build(tmp_path / "gate", "static")


def test_the_environment_chooses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSCOPE_BUILD_GATE", "none")
    assert build_gate.build(tmp_path / "gate") is None


def test_the_wheel_carries_the_gate_as_an_executable(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    if build_gate.build(tmp_path / "probe", "auto") is None:
        pytest.skip("no C compiler here")
    subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)),
        ],
        check=True,
        env={**os.environ, "AGENTSCOPE_BUILD_GATE": "static"},
        timeout=300,
    )
    (wheel,) = tmp_path.glob("agentscope_systemd-*.whl")
    # Not pure: tagged for this platform, for every Python 3 (the program is
    # no extension module).
    assert wheel.name.endswith(f"-py3-none-linux_{os.uname().machine}.whl")
    with zipfile.ZipFile(wheel) as z:
        info = z.getinfo("agentscope_systemd/_fleet/agentscope-gate")
        assert stat.S_IMODE(info.external_attr >> 16) & 0o111  # pip keeps the mode
        program = tmp_path / "agentscope-gate"
        program.write_bytes(z.read(info))
    program.chmod(0o755)
    # Static: it needs no loader, so the host's build runs on an older guest.
    assert not _interpreter(program.read_bytes())
    assert subprocess.run([str(program)], check=False).returncode == 126
