"""The wheel's build hook: the compiled launch gate (native/gate.c) goes into the package.

The program is what ``agentscope_systemd/_fleet/_spawn.py`` execs as the
gate of every launch; native/build_gate.py says how it is built and what
``AGENTSCOPE_BUILD_GATE`` chooses. A wheel with it is tagged for this
platform (``py3-none-linux_x86_64``); one without stays pure Python.
"""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_TARGET = "agentscope_systemd/_fleet/agentscope-gate"


def _build_gate() -> ModuleType:
    # By path: the build runs with the project root as its directory but not
    # on sys.path, and native/ is not a package that the wheel ships.
    path = Path(__file__).parent / "native" / "build_gate.py"
    spec = importlib.util.spec_from_file_location("agentscope_build_gate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GateHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compile the gate and put it in the wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        gate = _build_gate()
        if version == "editable":
            # An editable install imports the checkout: the program goes beside _spawn.py there.
            gate.build(Path(self.root) / _TARGET)
            return
        self._tmp = tempfile.mkdtemp(prefix="agentscope-gate-")
        out = Path(self._tmp) / "agentscope-gate"
        if gate.build(out) is None:
            return
        build_data["force_include"][str(out)] = _TARGET
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
