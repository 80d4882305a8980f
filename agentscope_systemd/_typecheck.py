"""``TYPE_CHECKING`` without importing :mod:`typing`, for the modules the fast paths load.

``agentscope exec``, ``call``, ``agentscope-shell``, the plain ``ls``,
``events``, ``stop`` and ``kill`` (``_cli/_direct.py``) and ``import
agentscope_systemd`` itself must start in milliseconds: :mod:`typing`
costs about 9 ms natively (more under TCG) and :mod:`collections.abc` pulls
in more. Their modules write ``from .._typecheck import TYPE_CHECKING`` and
put the imports their annotations need under ``if TYPE_CHECKING:`` (with
``from __future__ import annotations`` those are never evaluated). Type
checkers take any name ``TYPE_CHECKING`` as true (mypy's and ruff's rule),
so this one constant serves them all; tests/test_cli_fast.py holds the
imports. The generator keeps its own copy: it imports the standard
library only.
"""

__all__ = ["TYPE_CHECKING"]

TYPE_CHECKING = False
