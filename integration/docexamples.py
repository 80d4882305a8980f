"""The README's and docs/'s code blocks, with what each needs: for the tests that run them.

One reader for both sides: ``tests/test_docs.py`` runs on the host the
Python examples that need nothing, and ``integration/tests/test_docs.py``
runs in the VM the ones marked ``<!-- needs: systemd -->``. A mark is an
HTML comment right before the fence:

- ``<!-- needs: systemd -->`` (or ``tmux``, or the name of a command the
  example starts, such as ``claude``): it cannot run on a host without it;
- ``<!-- raises: RuntimeError -->``: it runs and ends with that exception.

Standard library only (the VM's test runner imports it from the payload).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FENCE", "Example", "blocks", "pages", "python_examples", "run_example"]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!--\s*(needs|raises):\s*([\w, -]+?)\s*-->\s*\n(?:\s*\n)?$")


@dataclass(frozen=True)
class Example:
    """A fenced block: where it is, its text, and its mark (kind, value) or None."""

    page: str
    line: int
    code: str
    mark: tuple[str, str] | None

    @property
    def needs(self) -> frozenset[str]:
        """What a ``needs:`` mark names; empty without one."""
        if self.mark is None or self.mark[0] != "needs":
            return frozenset()
        return frozenset(n.strip() for n in self.mark[1].split(",") if n.strip())

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages(root: Path) -> list[Path]:
    """The README and every page of docs/ under ``root``."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks(root: Path, lang: str) -> list[Example]:
    """Every ``lang`` block of the pages, with its mark."""
    found = []
    for page in pages(root):
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) != lang:
                continue
            mark = _MARK.search(text, 0, m.start())
            tag = (mark.group(1), mark.group(2)) if mark and mark.end() == m.start() else None
            found.append(Example(page.name, text.count("\n", 0, m.start()) + 1, m.group(2), tag))
    return found


def python_examples(root: Path) -> list[Example]:
    """Every Python block of the pages."""
    return blocks(root, "python")


def run_example(
    code: str, workdir: Path, *, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script of its own in ``workdir``, with this interpreter."""
    script = workdir / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=workdir,
        env=None if env is None else dict(env),
        check=False,
    )
