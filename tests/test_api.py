"""The public surface: what is exported, and the two facades agree."""

from __future__ import annotations

import inspect
import subprocess
import sys

import agentscope
from agentscope import AsyncFleet, Fleet


def test_all_public_names_exported_and_nothing_else() -> None:
    public = {n for n in dir(agentscope) if not n.startswith("_")}
    modules = {"lowlevel", "watchdog", "generator", "install"}  # public submodules
    assert public - modules == set(agentscope.__all__) - {"__version__"}
    for name in agentscope.__all__:
        assert hasattr(agentscope, name), name


def test_lowlevel_exports_resolve() -> None:
    import agentscope.lowlevel as low

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


def test_blocking_facade_mirrors_async_core() -> None:
    ops = [
        "launch",
        "adopt",
        "stop",
        "kill",
        "freeze",
        "thaw",
        "agents",
        "slice_limits",
        "events",
        "gc",
        "logs",
        "send",
        "attach",
        "attach_command",
    ]
    for op in ops:
        assert _public_params(getattr(Fleet, op)) == _public_params(getattr(AsyncFleet, op)), op
    assert _public_params(Fleet.__init__) == _public_params(AsyncFleet.__init__)


def test_library_imports_without_cli_dependencies() -> None:
    code = (
        "import sys; sys.modules['typer'] = None; sys.modules['rich'] = None\n"
        "import agentscope, agentscope.lowlevel\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
