"""The README and docs/ agree with the code: examples compile, commands and links exist."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
import typer

import agentscope
from cli._app import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _FENCE.finditer(text):
            if m.group(1) == lang:
                line = text.count("\n", 0, m.start()) + 1
                found.append((page.name, line, m.group(2)))
    return found


PYTHON = _blocks("python")
SHELL = _blocks("sh")


def _commands() -> dict[str, set[str]]:
    """Every command of the typer app, with its option names."""
    group = typer.main.get_command(app)
    out: dict[str, set[str]] = {}
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        out[name] = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    out[""] = {opt for p in group.params for opt in (*p.opts, *p.secondary_opts)}
    return out


@pytest.mark.parametrize(("page", "line", "code"), PYTHON, ids=[f"{p}:{n}" for p, n, _ in PYTHON])
def test_python_examples_compile(page: str, line: int, code: str) -> None:
    # Snippets may await at top level, as in an asyncio REPL.
    compile(code, f"{page}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(("page", "line", "code"), PYTHON, ids=[f"{p}:{n}" for p, n, _ in PYTHON])
def test_python_examples_import_what_exists(page: str, line: int, code: str) -> None:
    for names in re.findall(r"^from agentscope import (.+)$", code, re.M):
        for name in names.split(","):
            assert hasattr(agentscope, name.strip()), f"{page}:{line}: no agentscope.{name}"


def test_documented_commands_exist() -> None:
    commands = _commands()
    seen = 0
    for page, line, code in SHELL:
        for raw in code.splitlines():
            text = raw.split("#", 1)[0].strip()
            if not text.startswith("agentscope "):
                continue
            words = shlex.split(text)[1:]
            words = words[: words.index("--")] if "--" in words else words
            options = {w.split("=", 1)[0] for w in words if w.startswith("-")}
            positional = [w for w in words if not w.startswith("-")]
            # Global options come before the command; their values are not commands.
            while positional and positional[0] not in commands:
                positional.pop(0)
            assert positional, f"{page}:{line}: no command in {text!r}"
            name = positional[0]
            known = commands[name] | commands[""]
            assert options <= known, f"{page}:{line}: unknown options {options - known} in {text!r}"
            seen += 1
    assert seen >= 10


def test_make_targets_in_docs_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z-]+):", makefile, re.M))
    for page, line, code in SHELL:
        for target in re.findall(r"^make ([a-z-]+)", code, re.M):
            assert target in targets, f"{page}:{line}: no make target {target!r}"


def test_readme_starts_with_make_demo_and_links_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    first = SHELL[[p for p, _, _ in SHELL].index("README.md")][2]
    assert first.splitlines()[0].startswith("make demo")
    for page in ("quickstart", "python-api", "cli", "oom-detection", "systemd-versions"):
        assert f"docs/{page}.md" in readme, f"README does not link docs/{page}.md"


def test_doc_links_resolve() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"
