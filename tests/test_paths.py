"""The one path builder (agentscope_systemd/_paths.py): nothing it opens leaves its base."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentscope_systemd._paths import PathEscape, check_component, open_under


def test_creates_private_directories_and_file_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        os.close(open_under(tmp_path / "base", ("agentscope", "ci", "a.log")))
    finally:
        os.umask(old)
    d = tmp_path / "base" / "agentscope"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "ci").stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "ci" / "a.log").stat().st_mode) == 0o600


def test_narrows_a_directory_an_older_version_made_0755(tmp_path: Path) -> None:
    (tmp_path / "agentscope" / "ci").mkdir(parents=True, mode=0o755)
    (tmp_path / "agentscope" / "ci").chmod(0o755)
    os.close(open_under(tmp_path, ("agentscope", "ci", "a.log")))
    assert stat.S_IMODE((tmp_path / "agentscope" / "ci").stat().st_mode) == 0o700


@pytest.mark.parametrize("part", ["", ".", "..", "a/b", "../../x", "x\0y"])
def test_a_part_that_leaves_the_directory_is_refused(tmp_path: Path, part: str) -> None:
    with pytest.raises(PathEscape):
        open_under(tmp_path, ("logs", part))
    with pytest.raises(PathEscape):
        open_under(tmp_path, (part, "a.log"))
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


@pytest.mark.parametrize("planted", ["dir", "file"])
def test_a_planted_symlink_is_not_followed(tmp_path: Path, planted: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base = tmp_path / "base"
    (base / "agentscope").mkdir(parents=True)
    if planted == "dir":
        (base / "agentscope" / "ci").symlink_to(elsewhere)
    else:
        (base / "agentscope" / "ci").mkdir()
        (base / "agentscope" / "ci" / "a.log").symlink_to(elsewhere / "a.log")
    with pytest.raises(OSError, match=r"Too many levels of symbolic links|Not a directory"):
        open_under(base, ("agentscope", "ci", "a.log"))
    assert list(elsewhere.iterdir()) == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_check_component_accepts_only_plain_names(name: str) -> None:
    try:
        assert check_component(name) == name
    except PathEscape:
        assert name in ("", ".", "..") or "/" in name or "\0" in name
    else:
        assert "/" not in name
        assert name not in ("", ".", "..")
