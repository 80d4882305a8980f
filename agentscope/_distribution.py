"""Which distribution installed the ``agentscope`` import package, and the one that clashes.

The name ``agentscope`` on the package index belongs to another project,
which also installs an import package called ``agentscope``: the two
overwrite each other's files, and ``pip install -U agentscope`` replaces
this project with it. ``import agentscope`` warns in one line when that
distribution is installed beside this one, and ``agentscope doctor`` fails
its ``distribution`` check; both ask :func:`foreign_distribution`.

Cheap enough for every import (``agentscope exec`` included): one directory
listing per ``sys.path`` entry, looking for the metadata directory names
that installers write; :mod:`importlib.metadata` alone costs ~0.1 s to import.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["DISTRIBUTION", "foreign_distribution", "warn_if_foreign"]

#: This project's distribution name on the package index; the import name stays ``agentscope``.
DISTRIBUTION = "agentscope-systemd"

_FOREIGN = "agentscope"


def foreign_distribution(paths: Iterable[str] | None = None) -> tuple[str, str] | None:
    """(version, directory) of an unrelated ``agentscope`` distribution on ``paths``, if any.

    ``paths`` defaults to ``sys.path``. A distribution is named by its
    ``NAME-VERSION.dist-info`` (or ``NAME-VERSION-pyX.egg-info``, or
    ``NAME.egg-info``) directory; names compare as the packaging spec
    normalizes them, so ``AgentScope`` and ``agentscope`` are one name and
    ``agentscope_systemd`` (this project) another.
    """
    for entry in sys.path if paths is None else paths:
        try:
            with os.scandir(entry or ".") as it:
                names = [e.name for e in it if e.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue  # a zip file, a directory gone or unreadable
        for name in names:
            stem = name.rpartition(".")[0]
            dist, _, rest = stem.partition("-")
            if dist.lower().replace("_", "-").replace(".", "-") == _FOREIGN:
                version = rest.partition("-")[0] or "?"
                return version, os.path.abspath(entry or ".")
    return None


def warn_if_foreign() -> None:
    """Warn once, in one line, when the unrelated ``agentscope`` is installed beside this one.

    A Python warning (category RuntimeWarning), so ``-W ignore::RuntimeWarning``
    or ``PYTHONWARNINGS`` silence it like any other.
    """
    found = foreign_distribution()
    if found is None:
        return
    import warnings

    version, where = found
    warnings.warn_explicit(
        f"an unrelated package named 'agentscope' ({version}, in {where}) is installed beside "
        f"{DISTRIBUTION} and overwrites its files; fix: pip uninstall -y agentscope && "
        f"pip install --force-reinstall {DISTRIBUTION} (agentscope doctor checks it)",
        RuntimeWarning,
        "agentscope",
        0,
    )
