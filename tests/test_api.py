"""The public surface: what is exported, and the two facades agree."""

from __future__ import annotations

import inspect
import subprocess
import sys

import agentscope_systemd
from agentscope_systemd import AsyncFleet, Fleet


def test_all_public_names_exported_and_nothing_else() -> None:
    public = {n for n in dir(agentscope_systemd) if not n.startswith("_")}
    modules = {"lowlevel", "watchdog", "generator", "install"}  # public submodules
    assert public - modules == set(agentscope_systemd.__all__) - {"__version__"}
    for name in agentscope_systemd.__all__:
        assert hasattr(agentscope_systemd, name), name


def test_public_names_are_written_once() -> None:
    # __all__ is made from the table of where each name lives (_LAZY); the
    # imports for type checkers must name the same names from the same modules.
    import ast
    from pathlib import Path

    tree = ast.parse(Path(agentscope_systemd.__file__).read_text())
    typed = {
        alias.asname or alias.name: "." * node.level + (node.module or "")
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == agentscope_systemd._LAZY
    assert agentscope_systemd.__all__ == sorted([*typed, "__version__"])


def test_lowlevel_exports_resolve() -> None:
    import agentscope_systemd.lowlevel as low

    assert len(set(low.__all__)) == len(low.__all__)
    for name in low.__all__:
        assert getattr(low, name) is not None


def _public_params(fn: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [
        (p.name, p.kind, p.default)
        for p in sig.parameters.values()
        if p.name != "self" and not p.name.startswith("_")
    ]


def _operations(cls: type) -> set[str]:
    """The public methods and properties of a class."""
    return {
        n
        for n, v in inspect.getmembers(cls)
        if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property))
    }


def test_blocking_facade_mirrors_async_core() -> None:
    # The same operations, named alike, with the same parameters; the only
    # differences are how each opens and closes (Fleet opens as it is made).
    lifecycle = {"open", "aclose"}, {"close"}
    assert _operations(AsyncFleet) - lifecycle[0] == _operations(Fleet) - lifecycle[1]
    for op in _operations(Fleet) - lifecycle[1]:
        blocking, core = getattr(Fleet, op), getattr(AsyncFleet, op)
        if isinstance(core, property):
            assert isinstance(blocking, property), op
            continue
        assert _public_params(blocking) == _public_params(core), op
    assert _public_params(Fleet.__init__) == _public_params(AsyncFleet.__init__)


def test_a_blocking_agent_offers_what_an_agent_does() -> None:
    assert _operations(agentscope_systemd.Agent) <= _operations(agentscope_systemd.BlockingAgent)


def test_library_imports_without_cli_dependencies() -> None:
    code = (
        "import sys; sys.modules['typer'] = None; sys.modules['rich'] = None\n"
        "import agentscope_systemd, agentscope_systemd.lowlevel\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_error_tree_is_drawn_once_and_true() -> None:
    # Every public error is defined in _errors, and its docstring draws each
    # one under its parent: the drawing is parsed and compared with the classes.
    from agentscope_systemd import _errors

    drawn: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    tree = _errors.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]  # type: ignore[union-attr]
    for line in tree.splitlines():
        name = line.lstrip(" │├└─").split(" ", 1)[0]
        depth = len(line) - len(line.lstrip(" │├└─"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    classes = {
        n: c
        for n, c in vars(_errors).items()
        if isinstance(c, type) and issubclass(c, _errors.AgentscopeError)
    }
    real = {
        n: next((b.__name__ for b in c.__bases__ if b.__name__ in classes), None)
        for n, c in classes.items()
    }
    assert drawn == real
    assert set(classes) == set(_errors.__all__)
    public_errors = {
        n
        for n in agentscope_systemd.__all__
        if isinstance(getattr(agentscope_systemd, n), type)
        and issubclass(getattr(agentscope_systemd, n), BaseException)
    }
    assert public_errors <= set(classes)
    for n in public_errors:
        assert getattr(agentscope_systemd, n).__module__ == "agentscope_systemd._errors", n
