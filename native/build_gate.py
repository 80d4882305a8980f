"""Compile the launch gate (gate.c) into a program: for the wheel's build hook and the tests.

Static where the C library allows it, so that a wheel built on one
distribution runs on an older one (the VM matrix builds on the host and
installs into systemd 247's guest); dynamic otherwise, which is right for
a program built on the host that runs it.

``AGENTSCOPE_BUILD_GATE`` chooses: ``auto`` (the default: static, else
dynamic, else none, said on stderr), ``static`` (static or fail the
build), ``none`` (no program: the gate runs in Python, docs/install.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("gate.c")
MODES = ("auto", "static", "none")


class GateBuildError(Exception):
    """The gate could not be compiled as asked."""


def build(out: Path, mode: str | None = None) -> str | None:
    """Compile the gate to ``out``: "static" or "dynamic" as linked, None if not built.

    Raises GateBuildError when ``mode`` is ``static`` and a static program
    cannot be made, or when ``mode`` is not one of MODES.
    """
    mode = mode if mode is not None else os.environ.get("AGENTSCOPE_BUILD_GATE", "auto")
    if mode not in MODES:
        raise GateBuildError(f"AGENTSCOPE_BUILD_GATE={mode!r}: use one of {', '.join(MODES)}")
    if mode == "none":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    errors: list[str] = []
    for how in ("static", "dynamic") if mode == "auto" else ("static",):
        if cc is None:
            errors.append("no C compiler (cc) on PATH")
            break
        flags = ["-static"] if how == "static" else []
        argv = [
            cc,
            "-Os",
            "-s",
            "-Wall",
            "-Wextra",
            *flags,
            "-o",
            os.fspath(out),
            os.fspath(SOURCE),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return how
        errors.append(f"{how}: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    why = "; ".join(errors)
    if mode == "static":
        raise GateBuildError(
            f"cannot build the launch gate statically ({why}); install a C compiler and the "
            "C library's static archive (Debian: gcc libc6-dev; Fedora: gcc glibc-static)"
        )
    print(
        f"agentscope: the launch gate was not compiled ({why}); it will run in Python "
        "(preexec_fn). Install a C compiler (gcc) and build again to have it.",
        file=sys.stderr,
    )
    return None


if __name__ == "__main__":
    # make gate: the program beside _spawn.py in this checkout, as the wheel has it.
    try:
        how = build(Path(sys.argv[1]))
    except GateBuildError as exc:
        sys.exit(f"native/build_gate.py: {exc}")
    print(f"launch gate: {how or 'not built'} ({sys.argv[1]})")
