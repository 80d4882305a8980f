"""The man pages: generated from the CLI, checked in, rendered cleanly, shipped in the wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from agentscope_systemd._cli import _man
from agentscope_systemd._cli._app import COMMANDS, build_command

ROOT = Path(__file__).resolve().parent.parent
UPDATE = os.environ.get("AGENTSCOPE_UPDATE_SNAPSHOTS") == "1"


def test_the_checked_in_pages_are_the_generated_ones() -> None:
    if UPDATE:
        _man.write()
    for name, text in _man.pages().items():
        path = ROOT / "man" / name
        assert path.exists(), f"no {path}: make man"
        assert path.read_text() == text, f"{path} is stale: make man"
    assert {str(p.relative_to(ROOT / "man")) for p in (ROOT / "man").rglob("*.[18]")} == set(
        _man.pages()
    )


def test_the_page_has_every_command_and_option() -> None:
    page = _man.pages()["man1/agentscope.1"]
    for name in COMMANDS:
        assert f".SS agentscope {name}\n" in page
        for param in build_command(name).params:
            for opt in [*param.opts, *param.secondary_opts]:
                if param.param_type_name == "option":
                    assert f"\\fB{_man.roff_text(opt)}\\fR" in page, (name, opt)


@pytest.mark.skipif(shutil.which("groff") is None, reason="needs groff")
@pytest.mark.parametrize("name", list(_man.pages()))
def test_pages_render_without_warnings(name: str) -> None:
    done = subprocess.run(
        ["groff", "-man", "-ww", "-Tutf8", str(ROOT / "man" / name)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    assert done.stderr == ""
    text = done.stdout
    assert "agentscope" in text
    assert "\\e" not in text  # every escape was read as one


def test_the_wheel_ships_the_pages() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shared = config["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    for name in _man.pages():
        assert shared[f"man/{name}"] == f"share/man/{name}"


def test_roff_text_cannot_start_a_request() -> None:
    assert _man.roff_text(".SH x\n'y\\z -q") == "\\&.SH x\n\\&'y\\ez \\-q"
