"""Installing agentscope into systemd: the agents slice, the monitor service, the generator.

Plans are plain data (files with their content and mode, then the commands
to run); :func:`apply_plan` writes the files and records a manifest, so
:func:`plan_uninstall` removes exactly what an install wrote. ``pip install``
alone never touches systemd. A system install refuses (:class:`UntrustedExecutable`)
to make root run a file that another user could change. See docs/install.md.
"""

from ._install import MGLRU_MIN_TTL_DEFAULT as MGLRU_MIN_TTL_DEFAULT
from ._install import InstallPlan as InstallPlan
from ._install import UninstallPlan as UninstallPlan
from ._install import UntrustedExecutable as UntrustedExecutable
from ._install import apply_plan as apply_plan
from ._install import detect_systemd_version as detect_systemd_version
from ._install import load_manifest as load_manifest
from ._install import mglru_protection as mglru_protection
from ._install import plan_install as plan_install
from ._install import plan_uninstall as plan_uninstall

__all__ = [
    "MGLRU_MIN_TTL_DEFAULT",
    "InstallPlan",
    "UninstallPlan",
    "UntrustedExecutable",
    "apply_plan",
    "detect_systemd_version",
    "load_manifest",
    "mglru_protection",
    "plan_install",
    "plan_uninstall",
]
