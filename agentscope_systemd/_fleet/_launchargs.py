"""A launch's arguments checked before anything exists (no D-Bus, no registry).

Its resource controls (``memory_max``, ``tasks_max``...) are checked with
the other properties, by :func:`._scopeprops.build`, as InvalidConfig.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

from .._errors import LaunchError

__all__ = ["check_argv"]


def check_argv(argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None) -> str:
    if isinstance(argv, str | bytes) or not argv:
        raise LaunchError(f"argv must be a non-empty list of strings, not {argv!r}")
    if not all(isinstance(a, str) for a in argv):
        raise LaunchError(f"argv must hold only strings: {list(argv)!r}")
    if env is not None:
        if not isinstance(env, Mapping):
            raise LaunchError(f"env must be a mapping of str to str, not {type(env).__name__}")
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise LaunchError(f"env must map str to str; these entries do not: {bad!r}")
        bad = [k for k, v in env.items() if not k or "=" in k or "\0" in k or "\0" in v]
        if bad:
            raise LaunchError(
                f"env names must be non-empty, without '=' or NUL, and values without NUL: {bad!r}"
            )
    if any("\0" in a for a in argv):
        raise LaunchError(f"argv may not hold a NUL character: {list(argv)!r}")
    if not argv[0]:
        raise LaunchError("argv[0] is empty: give the program to run")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
        raise LaunchError(f"cwd must be a non-empty path without NUL, not {cwd!r}")
    if cwd is not None and not os.path.isdir(cwd):
        raise LaunchError(f"cwd {cwd!r} is not a directory")
    if cwd is not None and not os.access(cwd, os.X_OK):
        raise LaunchError(f"cwd {cwd!r} is not accessible")
    # Resolved on the agent's own PATH, before any scope exists.
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    prog = argv[0]
    if os.sep in prog:
        full = prog if os.path.isabs(prog) or cwd is None else os.path.join(cwd, prog)
        if not os.path.isfile(full):
            raise LaunchError(f"{prog!r}: no such file")
        if not os.access(full, os.X_OK):
            raise LaunchError(f"{prog!r} is not executable (chmod +x it)")
        return full
    found = shutil.which(prog, path=path)
    if found is None:
        raise LaunchError(f"{prog!r} not found on the agent's PATH ({path})")
    return found
