"""The README and docs/ agree with the code.

Python examples compile and run (or are marked with what they need), every
option of docs/cli.md is a real one and the reverse, docs/python-api.md
names the real signatures and errors, commands and links exist.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from pathlib import Path

import pytest
import typer

import agentscope_systemd
from agentscope_systemd._cli._app import app
from integration.docexamples import FENCE, blocks, pages, python_examples, run_example

ROOT = Path(__file__).resolve().parent.parent
PAGES = pages(ROOT)
_FENCE = FENCE


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    return [(e.page, e.line, e.code) for e in blocks(ROOT, lang)]


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
    for names in re.findall(r"^from agentscope_systemd import (.+)$", code, re.M):
        for name in names.split(","):
            assert hasattr(agentscope_systemd, name.strip()), f"{page}:{line}: no agentscope.{name}"


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


# -- Python examples run -----------------------------------------------------------

#: ``<!-- needs: systemd -->`` (or tmux, or a command) just before a fence: the
#: example cannot run on a host without it (integration/tests/test_docs.py runs
#: those in the VM); ``<!-- raises: RuntimeError -->``: it runs and ends with
#: that exception, as its text says. Every other example runs.
#: What a block marked ``needs: systemd`` must use, else the mark is stale.
_SYSTEMD_NAMES = re.compile(r"\b(AsyncFleet|Fleet|probe|probe_sync|agentscope\.install)\b")


def _marked_python() -> list[tuple[str, int, str, tuple[str, str] | None]]:
    return [(e.page, e.line, e.code, e.mark) for e in python_examples(ROOT)]


MARKED = _marked_python()


@pytest.mark.parametrize(
    ("page", "line", "code", "mark"), MARKED, ids=[f"{p}:{n}" for p, n, _, _ in MARKED]
)
def test_python_examples_run_or_say_why_not(
    page: str, line: int, code: str, mark: tuple[str, str] | None, tmp_path: Path
) -> None:
    if mark is not None and mark[0] == "needs":
        needs = {n.strip() for n in mark[1].split(",")}
        commands = needs - {"systemd", "tmux"}  # the rest: commands the example starts
        assert all(re.fullmatch(r"[a-z][a-z0-9-]*", c) for c in commands), (
            f"{page}:{line}: unknown need {needs}"
        )
        if "systemd" in needs:
            assert _SYSTEMD_NAMES.search(code), f"{page}:{line}: marked needs: systemd, uses none"
        pytest.skip(f"{page}:{line} needs {mark[1]}")
    # Top-level await, as in an asyncio REPL, is not runnable as a script: mark those.
    done = run_example(code, tmp_path, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if mark is not None:  # raises: NAME
        assert done.returncode != 0, f"{page}:{line}: was to raise {mark[1]}"
        assert done.stderr.strip().splitlines()[-1].startswith(mark[1] + ":"), done.stderr
    else:
        assert done.returncode == 0, f"{page}:{line}:\n{done.stderr}"


def test_some_python_examples_run_on_the_host() -> None:
    # A mark on every block would pass the test above and check nothing.
    assert sum(mark is None or mark[0] == "raises" for _, _, _, mark in MARKED) >= 5


# -- docs/cli.md and the real commands ----------------------------------------------

_CLI_MD = ROOT / "docs" / "cli.md"
_HELP = {"--help", "-h"}
_COMPLETION = {"--install-completion", "--show-completion"}


def _documented_options() -> dict[str, set[str]]:
    """docs/cli.md's option tables: command ("" for the globals) -> its options."""
    out: dict[str, set[str]] = {}
    section: str | None = None
    for raw in _CLI_MD.read_text().splitlines():
        heading = re.match(r"^#{2,3} (?:`agentscope (\w+)`|(Global options))", raw)
        if heading:
            section = heading.group(1) or ""
            out[section] = set()
        elif raw.startswith("## "):
            section = None
        elif section is not None and raw.startswith("| `"):
            first = raw.split("|")[1]
            cells = re.findall(r"`([^`]+)`", first)
            out[section] |= {o for o in cells if o.startswith("-") and " " not in o}
    return out


def test_every_option_in_docs_cli_md_is_real_and_every_real_one_documented() -> None:
    documented = _documented_options()
    real = {
        name: {o for o in opts if o.startswith("-")} - _HELP for name, opts in _commands().items()
    }
    real[""] -= _COMPLETION  # named in the line under the table
    assert set(documented) == set(real)
    for name, opts in real.items():
        where = f"agentscope {name}" if name else "the global options"
        assert documented[name] - opts == set(), f"{where}: documented, not real"
        assert opts - documented[name] == set(), f"{where}: real, not documented"
    assert "--install-completion" in _CLI_MD.read_text()


def test_every_option_named_in_the_prose_of_docs_cli_md_exists() -> None:
    known = set().union(*_commands().values()) | _COMPLETION
    prose = "\n".join(
        line for line in _CLI_MD.read_text().splitlines() if not line.startswith("| ")
    )
    prose = re.sub(r"systemd-run[^`\n]*", "", prose)  # systemd-run's options are its own
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", prose))
    assert named - known == set(), f"docs/cli.md names options no command has: {named - known}"


def test_exec_fast_path_takes_every_documented_exec_option() -> None:
    from agentscope_systemd._cli._exec import parse_exec_args

    values = {
        "--memory-max": "1G",
        "--tasks-max": "32",
        "--cpu-weight": "100",
        "--io-weight": "100",
        "-p": "TasksMax=64",
        "--property": "TasksMax=64",
        "--reap-after": "keep",
        "--fallback": "run",
    }
    for opt in _documented_options()["exec"]:
        args = [opt, values[opt]] if opt in values else [opt]
        parsed = parse_exec_args([*args, "me", "--", "true"])
        assert parsed.name == "me", opt


# -- the README's claims ---------------------------------------------------------------


def test_readme_says_probe_is_async_and_probe_sync_blocks() -> None:
    import inspect

    readme = (ROOT / "README.md").read_text()
    assert inspect.iscoroutinefunction(agentscope_systemd.probe)
    assert not inspect.iscoroutinefunction(agentscope_systemd.probe_sync)
    row = next(line for line in readme.splitlines() if "agentscope_systemd.probe(" in line)
    assert "await agentscope_systemd.probe(" in row
    assert "agentscope_systemd.probe_sync(" in row


def test_readme_exec_figures_are_the_benchmarks_own() -> None:
    readme = (ROOT / "README.md").read_text()
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    paragraphs = [" ".join(p.split()) for p in readme.split("\n\n")]
    (sentence,) = [p for p in paragraphs if "`exec` starts" in p]
    figures = re.findall(r"\d[\d.,]*\s?(?:ms|x)\b", sentence)
    assert len(figures) >= 5, sentence
    for figure in figures:
        assert figure.replace(" ", "") in bench.replace(" ", "").replace("*", ""), figure
    assert "about as fast as" not in sentence
    # Which figures are native and which the VM's (TCG: many times slower), said (#28).
    assert "Natively" in sentence
    assert "TCG" in sentence


# -- docs/python-api.md and the real signatures -------------------------------------------

_API_MD = ROOT / "docs" / "python-api.md"
_CALL = re.compile(r"`(\w+)\(([^`]*)\)`")


def _parse_params(text: str) -> list[tuple[str, str | None, bool]]:
    """``a, b=1, *, c=None`` -> [(name, default text or None, keyword-only)]."""
    out: list[tuple[str, str | None, bool]] = []
    keyword_only = False
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "*":
            keyword_only = True
            continue
        name, eq, default = part.partition("=")
        star = name.strip().startswith("**")  # **options: not keyword-only, a kind of its own
        out.append((name.strip(), default.strip() if eq else None, keyword_only and not star))
    return out


def _real_params(fn: object) -> list[tuple[str, object, bool]]:
    import inspect

    out = []
    for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
        if p.name == "self" or p.name.startswith("_"):
            continue
        name = f"**{p.name}" if p.kind is p.VAR_KEYWORD else p.name
        out.append((name, p.default, p.kind is p.KEYWORD_ONLY))
    return out


def _api_rows() -> list[tuple[str, str]]:
    text = _API_MD.read_text()
    table = text[text.index("## Operations") :].split("\n## ")[0]
    return [
        (name, params)
        for line in table.splitlines()
        if line.startswith("| `")
        for name, params in _CALL.findall(line.split("|")[1])
    ]


_ASYNC_ONLY = {"open", "aclose"}  # Fleet opens as it is made, and has close()


def test_python_api_operations_are_the_real_signatures() -> None:
    import inspect
    import signal

    rows = _api_rows()
    assert len(rows) >= 15
    for name, params in rows:
        # The page says which are AsyncFleet's alone.
        for cls in (agentscope_systemd.AsyncFleet, agentscope_systemd.Fleet):
            if cls is agentscope_systemd.Fleet and name in _ASYNC_ONLY:
                assert not hasattr(cls, name), f"Fleet.{name} exists: document it for both"
                continue
            real = _real_params(getattr(cls, name))
            documented = _parse_params(params)
            assert [(n, k) for n, _, k in documented] == [(n, k) for n, _, k in real], (
                f"{cls.__name__}.{name}: documented ({params}), real {real}"
            )
            for (n, text, _), (_, default, _) in zip(documented, real, strict=True):
                if n.startswith("**"):
                    continue
                if text is None:
                    assert default is inspect.Parameter.empty, f"{name}: {n} has a default"
                else:
                    value = eval(text, {"SIGTERM": signal.SIGTERM})
                    assert value == default, f"{name}: {n}={text}, real {default!r}"


def test_every_public_fleet_operation_is_in_python_api_md() -> None:
    import inspect

    documented = {name for name, _ in _api_rows()}
    public = {
        n
        for n, f in inspect.getmembers(agentscope_systemd.AsyncFleet, inspect.isfunction)
        if not n.startswith("_")
    }
    assert public - documented == set(), f"not in docs/python-api.md: {public - documented}"


def test_python_api_constructor_is_the_real_one() -> None:
    text = _API_MD.read_text()
    block = text[text.index("## Constructing a fleet") :].split("```text\n")[1].split("```")[0]
    params = block[block.index("AsyncFleet(") + len("AsyncFleet(") : block.index(")\n")]
    documented = _parse_params(" ".join(params.split()))
    real = _real_params(agentscope_systemd.AsyncFleet.__init__)
    assert [(n, k) for n, _, k in documented] == [(n, k) for n, _, k in real]
    for (n, text, _), (_, default, _) in zip(documented, real, strict=True):
        assert text is not None, n
        assert eval(text) == default, f"AsyncFleet({n}={text}), real {default!r}"


def test_python_api_errors_are_every_public_error() -> None:
    text = _API_MD.read_text()
    table = text[text.index("## Errors") :].split("\n## ")[0]
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?", table, re.M))
    names = {n for pair in documented for n in pair if n}
    errors = {
        n
        for n in agentscope_systemd.__all__
        if isinstance(getattr(agentscope_systemd, n), type)
        and issubclass(getattr(agentscope_systemd, n), agentscope_systemd.AgentscopeError)
        and n != "AgentscopeError"
    }
    assert errors - names == set(), f"errors missing from docs/python-api.md: {errors - names}"
    assert names - errors == set(), (
        f"docs/python-api.md names errors that are not: {names - errors}"
    )


def _listed_modules(package: str) -> set[str]:
    """The ``.py`` files docs/architecture.md's module listing names under ``package/``."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    listing = _FENCE.search(text)
    assert listing is not None, "architecture.md: no module listing"
    names: set[str] = set()
    inside = False
    for line in listing.group(2).splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):  # a package's own line: "agentscope_systemd/", ".../cli/ ..."
            inside = line.split()[0] == package + "/"
        elif inside:
            # A module's bare name; a path ("tests/test_bus.py") is not one.
            names.update(re.findall(r"(?<![\w/.])\w+\.py\b", line))
    return names


_PACKAGES = sorted(
    str(p.parent.relative_to(ROOT)) for p in (ROOT / "agentscope_systemd").rglob("__init__.py")
)


@pytest.mark.parametrize("package", _PACKAGES)
def test_architecture_lists_every_module(package: str) -> None:
    listed = _listed_modules(package)
    present = {p.name for p in (ROOT / package).glob("*.py")}
    assert present - listed == set(), (
        f"docs/architecture.md does not list these modules of {package}"
    )
    assert listed - present == set(), (
        f"docs/architecture.md lists modules of {package} that are gone"
    )


def test_json_md_lists_every_event_kind_and_no_other() -> None:
    """docs/json.md's event table names exactly the kinds that have a schema
    (schemas/events/KIND.json, which tests/test_contract.py holds to the code)."""
    text = (ROOT / "docs" / "json.md").read_text()
    table = text.partition("| kind | seen by | what happened |")[2].partition("\n\n")[0]
    documented = {
        kind
        for row in table.splitlines()[2:]
        for kind in re.findall(r"`([a-z_]+)`", row.split("|")[1])
    }
    schemas = {p.stem for p in (ROOT / "schemas" / "events").glob("*.json")}
    assert documented == schemas, (schemas - documented, documented - schemas)


def _cli_kinds() -> set[str]:
    """The ``kind`` words the command line can put in its error: classify()'s, and those
    its own failures carry (``Failed(message, kind)``), read from cli/'s source."""
    import ast

    kinds: set[str] = set()
    for path in sorted((ROOT / "agentscope_systemd" / "_cli").glob("*.py")):
        if path.name == "_readapi.py":  # the read API's: HTTP answers, docs/json.md
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "classify":
                for item in ast.walk(node):
                    if isinstance(item, ast.Tuple) and len(item.elts) in (2, 3):
                        last = item.elts[-1]
                        options = (
                            [last.body, last.orelse] if isinstance(last, ast.IfExp) else [last]
                        )
                        kinds |= {
                            o.value
                            for o in options
                            if isinstance(o, ast.Constant) and isinstance(o.value, str)
                        }
            if isinstance(node, ast.Call) and len(node.args) >= 2:
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                kind = node.args[1]
                if (
                    name in ("Failed", "__init__")
                    and isinstance(kind, ast.Constant)
                    and isinstance(kind.value, str)
                ):
                    kinds.add(kind.value)
    return kinds


def test_cli_md_lists_every_error_kind_and_no_other() -> None:
    """docs/cli.md's exit tables name exactly the kinds an error of the CLI can have."""
    text = (ROOT / "docs" / "cli.md").read_text()
    rows: list[str] = []
    for head in ("| exit | meaning | kinds |", "| exit | `exec` | kinds |"):
        rows += text.partition(head)[2].partition("\n\n")[0].splitlines()[2:]
    documented = {k for row in rows for k in re.findall(r"`([a-z_]+)`", row.split("|")[3])}
    kinds = _cli_kinds()
    assert {"usage", "bad_input", "not_found", "interrupted", "no_log"} <= kinds
    assert documented == kinds, (kinds - documented, documented - kinds)


def test_the_librarys_comments_cite_what_a_reader_can_open() -> None:
    # A comment or docstring citing a file cites one in this repository
    # (docs/*.md) or a man page or kernel document; not a notes file kept
    # elsewhere (FIELD-NOTES lived outside the repository).
    package = ROOT / "agentscope_systemd"
    cited: set[str] = set()
    for path in package.rglob("*.py"):
        text = path.read_text()
        assert "FIELD-NOTES" not in text, path
        cited.update(re.findall(r"docs/[a-z0-9_-]+\.md", text))
    assert cited
    assert sorted(c for c in cited if not (ROOT / c).is_file()) == []
