"""Print pip constraints pinning every dependency to its declared floor.

CI's lowest job (.ci/run, `make lowest`) installs the package with these
constraints and runs the host tests, so a ``>=`` in pyproject.toml is a
version that was shown to work, not a guess. Only direct dependencies are
pinned (the base ones and the extras named on the command line); what they
pull in resolves as pip chooses, like uv's ``--resolution lowest-direct``.
A floor must be a release that exists (``2.3.1``, not ``2.3`` where no
2.3.0 was published): pip takes ``==2.3`` as 2.3.0.

    python3 .ci/floors.py monitor tmux > floors.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*>=\s*([^,;\s]+)")


def floors(project: dict[str, object], extras: list[str]) -> list[str]:
    """``name==floor`` for each ``name>=floor`` among the base and ``extras``' requirements."""
    own = str(project["name"])
    optional = project.get("optional-dependencies", {})
    assert isinstance(optional, dict)
    requirements = list(project.get("dependencies", []))  # type: ignore[call-overload]
    for extra in extras:
        requirements += optional[extra]
    pins = []
    for requirement in requirements:
        match = _FLOOR.match(requirement)
        if match and match.group(1) != own:
            pins.append(f"{match.group(1)}=={match.group(2)}")
    return sorted(set(pins))


def main(argv: list[str]) -> int:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    print("\n".join(floors(project, argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
