"""Install hints name this project's distribution, never the unrelated ``agentscope``.

``pip install 'agentscope[monitor]'`` installs another project from the
package index (issue 28): every hint must say ``agentscope-systemd``, the
``name`` in pyproject.toml.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from agentscope_systemd._cli import _http
from agentscope_systemd._cli._errors import Failed
from agentscope_systemd._errors import TmuxUnavailable
from agentscope_systemd._fleet import _tmux

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]


def test_the_monitor_face_without_prometheus_names_the_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # "not installed"
    state = _http.FaceState("default", "user", 2.0)
    with pytest.raises(Failed) as raised:
        _http.start_face(("127.0.0.1", 0), state)
    assert f"pip install '{DISTRIBUTION}[monitor]'" in str(raised.value)


def test_tmux_without_libtmux_names_the_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "libtmux", None)
    with pytest.raises(TmuxUnavailable) as raised:
        _tmux._libtmux()
    assert f"pip install '{DISTRIBUTION}[tmux]'" in str(raised.value)


def test_the_readme_names_the_distribution_in_its_extras() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "agentscope[" not in readme.replace(f"{DISTRIBUTION}[", "")
    assert f"`{DISTRIBUTION}[monitor]`" in readme
