"""The docs' Python examples that need systemd, run as their reader would: root and a user.

The host's docs tests run the examples that need nothing; those marked
``<!-- needs: systemd -->`` run here, against the real manager, each as a
script of its own (integration/docexamples.py reads the pages; vm.py puts
README.md and docs/ on the payload).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from docexamples import Example, python_examples, run_example

from agentscope_systemd import AsyncFleet

ROOT = Path(__file__).resolve().parents[1]  # the payload's copy of README.md and docs/
EXAMPLES = (
    [e for e in python_examples(ROOT) if "systemd" in e.needs]
    if (ROOT / "README.md").exists()
    else []
)
#: The fleets the examples use: their agents are stopped after each one.
FLEETS = ("default", "example", "ci")


def _why_not(example: Example) -> str | None:
    try:  # the parser takes a top-level `async with`; the compiler does not
        compile(example.code, example.id, "exec", dont_inherit=True)
    except SyntaxError:
        return "a fragment (top-level await), not a script"
    for need in sorted(example.needs - {"systemd"}):
        if shutil.which(need) is None:
            return f"needs {need}, not installed here"
    return None


async def _stop_agents() -> None:
    for name in FLEETS:
        async with AsyncFleet(name) as fleet:
            for agent in await fleet.agents():
                await fleet.stop(agent.name, timeout=5)


def test_the_pages_came_along() -> None:
    # An empty list would pass the test below and check nothing.
    assert len(EXAMPLES) >= 8, [e.id for e in EXAMPLES]


@pytest.mark.heavy("docs")
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_a_docs_example_runs(example: Example, tmp_path: Path) -> None:
    why = _why_not(example)
    if why is not None:
        pytest.skip(f"{example.id}: {why}")
    try:
        done = run_example(example.code, tmp_path, timeout=180)
    finally:
        asyncio.run(_stop_agents())
    assert done.returncode == 0, f"{example.id}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
