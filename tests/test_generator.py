"""agentscope-generator: what it writes, where, and how it survives bad configs.

Each test runs the generator as systemd does, as a separate ``python3 -I``
process with output directories, and looks at the files it left. Expected
trees live in tests/golden/; regenerate them after an intended change with
``AGENTSCOPE_REGEN_GOLDEN=1 pytest tests/test_generator.py`` and review the diff.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentscope_systemd import _install, generator
from agentscope_systemd._errors import InvalidName
from agentscope_systemd._names import validate_name

GENERATOR = Path(generator.__file__)
GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("AGENTSCOPE_REGEN_GOLDEN") == "1"

CUSTOM = """\
[slice]
name = "app-ai-agents.slice"
oomd_pressure_limit = "65.5%"

[monitor]
exec = "/opt/agentscope/bin/agentscope"
watchdog_sec = 10

[[fleet]]
name = "alpha"

[[fleet]]
name = "beta"
manager = "user"
users = ["alice"]

[[fleet]]
name = "gamma_1.x"
manager = "user"
"""

Entry = tuple[str, bytes | str, int]


def snapshot(top: Path) -> dict[str, Entry]:
    """Every file and symlink under ``top``: kind, content or target, and mode."""
    tree: dict[str, Entry] = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink():
            tree[rel] = ("link", os.readlink(path), 0)
        elif path.is_file():
            tree[rel] = ("file", path.read_bytes(), stat.S_IMODE(path.stat().st_mode))
    return tree


def run(
    tmp_path: Path,
    *args: str,
    config: str | None = None,
    env: dict[str, str] | None = None,
    script: Path = GENERATOR,
) -> subprocess.CompletedProcess[str]:
    """Run the generator in ``tmp_path`` with the config text ``config`` (None: no file).

    The config path is relative (cwd is ``tmp_path``) so the header the
    generator writes, which names it, is the same on every run.
    """
    if config is not None:
        (tmp_path / "agentscope.toml").write_text(config)
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AGENTSCOPE_CONFIG": "agentscope.toml",
        "SYSTEMD_LOG_TARGET": "console",  # never write test noise into the host's kmsg
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-I", str(script), *args],
        cwd=tmp_path,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def check_golden(name: str, out: Path) -> None:
    golden = GOLDEN / name
    if REGEN:
        shutil.rmtree(golden, ignore_errors=True)
        shutil.copytree(out, golden, symlinks=True)
    assert golden.is_dir(), f"no golden tree {golden}: run with AGENTSCOPE_REGEN_GOLDEN=1"
    assert snapshot(out) == snapshot(golden)


GOLDEN_CASES = {
    # name: (config text or None, extra env, flags)
    "default-system": (None, {}, ["--system"]),
    "default-user": (None, {"SYSTEMD_SCOPE": "user"}, []),
    "custom-system": (CUSTOM, {"SYSTEMD_SCOPE": "system"}, []),
    "custom-user-alice": (CUSTOM, {"SYSTEMD_SCOPE": "user", "USER": "alice"}, []),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_output_matches_golden(tmp_path: Path, case: str) -> None:
    config, env, flags = GOLDEN_CASES[case]
    out = tmp_path / "normal"
    result = run(
        tmp_path,
        *flags,
        str(out),
        str(tmp_path / "early"),
        str(tmp_path / "late"),
        config=config,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    check_golden(case, out)


def test_default_output_is_what_the_design_asks_for(tmp_path: Path) -> None:
    """Spot checks that the golden files themselves are right, not merely stable."""
    out = tmp_path / "out"
    assert run(tmp_path, "--system", str(out)).returncode == 0
    slice_unit = (out / "app-agentscope-agents.slice").read_text()
    for line in (
        "MemoryAccounting=yes",
        "MemoryHigh=infinity",
        "MemoryMax=infinity",
        "MemorySwapMax=infinity",
    ):
        assert f"\n{line}\n" in slice_unit
    # systemd-oomd's settings are drop-ins, numbered after the distributions' 10- ones.
    dropin = "50-agentscope-oomd.conf"
    agents_oomd = (out / f"app-agentscope-agents.slice.d/{dropin}").read_text()
    for line in (
        "ManagedOOMMemoryPressure=kill",
        "ManagedOOMMemoryPressureLimit=80%",
        "ManagedOOMSwap=auto",
        "ManagedOOMPreference=avoid",
    ):
        assert f"\n{line}\n" in agents_oomd
    assert "ManagedOOM" not in slice_unit.replace("ManagedOOM*", "")
    scopes = (out / f"agentscope-.scope.d/{dropin}").read_text()
    assert "\n[Scope]\nManagedOOMPreference=avoid\n" in scopes
    parent = (out / f"app-agentscope.slice.d/{dropin}").read_text()
    assert "\nManagedOOMMemoryPressure=auto\nManagedOOMSwap=auto\n" in parent
    monitor_oomd = (out / f"agentscope-monitor@.service.d/{dropin}").read_text()
    assert "\n[Service]\nManagedOOMPreference=avoid\n" in monitor_oomd
    monitor = (out / "agentscope-monitor@.service").read_text()
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=/usr/local/bin/agentscope --manager system --fleet %i monitor --guard",
        "WatchdogSec=30s",
        "OOMPolicy=continue",
        "OOMScoreAdjust=200",
        "Restart=on-failure",
        "RestartSec=2",
        "Slice=app-agentscope.slice",
        "KillMode=control-group",
        "WantedBy=multi-user.target",
    ):
        assert f"\n{line}\n" in monitor
    for text in (slice_unit, monitor):  # every placeholder filled in
        assert not re.search(r"@[A-Z_]+@", text)
    link = out / "multi-user.target.wants/agentscope-monitor@default.service"
    assert os.readlink(link) == "../agentscope-monitor@.service"
    assert link.resolve() == (out / "agentscope-monitor@.service").resolve()


def test_user_manager_fleets_follow_users_list(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {"SYSTEMD_SCOPE": "user", "USER": "bob"}
    assert run(tmp_path, str(out), config=CUSTOM, env=env).returncode == 0
    wants = sorted(p.name for p in (out / "default.target.wants").iterdir())
    assert wants == ["agentscope-monitor@gamma_1.x.service"]  # beta is alice's only
    assert not (out / "multi-user.target.wants").exists()


def test_user_mode_from_the_directory_it_runs_from(tmp_path: Path) -> None:
    user_generators = tmp_path / "user-generators"
    user_generators.mkdir()
    script = user_generators / "agentscope-generator"
    shutil.copy(GENERATOR, script)
    shutil.copy(GENERATOR.with_name("_genconfig.py"), user_generators)  # its other half
    shutil.copytree(GENERATOR.parent.parent / "units", user_generators.parent / "units")
    out = tmp_path / "out"
    config = '[[fleet]]\nname = "mine"\nmanager = "user"\n'
    assert run(tmp_path, str(out), script=script, config=config).returncode == 0
    assert (out / "default.target.wants/agentscope-monitor@mine.service").is_symlink()
    assert "\nWantedBy=default.target\n" in (out / "agentscope-monitor@.service").read_text()


def test_writes_nothing_outside_its_output_directory(tmp_path: Path) -> None:
    (tmp_path / "agentscope.toml").write_text(CUSTOM)
    for name in ("normal", "early", "late"):
        (tmp_path / name).mkdir()
    before = snapshot(tmp_path)
    dirs = [str(tmp_path / n) for n in ("normal", "early", "late")]
    assert run(tmp_path, *dirs).returncode == 0
    after = snapshot(tmp_path)
    new = set(after) - set(before)
    assert new == {
        "normal/app-ai-agents.slice",
        "normal/agentscope-monitor@.service",
        "normal/multi-user.target.wants/agentscope-monitor@alpha.service",
        "normal/app-ai-agents.slice.d/50-agentscope-oomd.conf",
        "normal/app-ai.slice.d/50-agentscope-oomd.conf",
        "normal/agentscope-.scope.d/50-agentscope-oomd.conf",
        "normal/agentscope-monitor@.service.d/50-agentscope-oomd.conf",
    }
    assert {p: after[p] for p in before} == before
    assert not any((tmp_path / "early").iterdir())
    assert not any((tmp_path / "late").iterdir())


BROKEN = {
    "bad TOML": ("[slice\nname = 1\n", "not valid TOML"),
    "not UTF-8": (b"\xff\xfe[slice]".decode("latin-1"), "not valid TOML"),
    "bad fleet name": ('[[fleet]]\nname = "-rm -rf"\n', "name '-rm -rf' must not start with '-'"),
    "fleet with a slash": ('[[fleet]]\nname = "a/b"\n', "contains '/'"),
    "fleet not a table array": ('fleet = "default"\n', "fleet must be an array"),
    "slice name wrong type": ("[slice]\nname = 5\n", "[slice] name = 5 must be a string"),
    "slice without parent": ('[slice]\nname = "agents.slice"\n', "dashes are the hierarchy"),
    "limit not a percentage": ('[slice]\noomd_pressure_limit = "120%"\n', "0% to 100%"),
    "limit a number": ("[slice]\noomd_pressure_limit = 80\n", "must be a string like '80%'"),
    "watchdog a string": ('[monitor]\nwatchdog_sec = "30"\n', "whole number of seconds"),
    "watchdog a bool": ("[monitor]\nwatchdog_sec = true\n", "whole number of seconds"),
    "exec relative": ('[monitor]\nexec = "agentscope"\n', "must be an absolute path"),
    "exec with a space": ('[monitor]\nexec = "/opt/my tools/agentscope"\n', "contains ' '"),
    "monitor not a table": ("monitor = 3\n", "[monitor] must be a table"),
    "arrays nested 5000 deep": (
        "x = " + "[" * 5000 + "]" * 5000 + "\n",
        "nests arrays or tables too deeply",
    ),
    "larger than a megabyte": ("# " + "x" * (1 << 20) + "\n", "larger than"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_config_still_boots_with_defaults(tmp_path: Path, case: str) -> None:
    text, message = BROKEN[case]
    if case == "not UTF-8":
        (tmp_path / "agentscope.toml").write_bytes(b"\xff\xfe[slice]")
        text = None
    out = tmp_path / "normal"
    result = run(tmp_path, "--system", str(out), "early", "late", config=text)
    assert result.returncode == 0
    assert result.stderr.startswith("agentscope-generator: agentscope.toml")
    assert message in result.stderr
    check_golden("default-system", out)


def test_one_bad_fleet_is_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    config = '[[fleet]]\nname = "ok"\n[[fleet]]\nname = ".hidden"\n[[fleet]]\nname = "ok"\n'
    out = tmp_path / "out"
    result = run(tmp_path, "--system", str(out), config=config)
    assert result.returncode == 0
    assert "'.hidden' must not start with '.'" in result.stderr
    assert "listed twice" in result.stderr
    wants = sorted(p.name for p in (out / "multi-user.target.wants").iterdir())
    assert wants == ["agentscope-monitor@ok.service"]


def test_empty_fleet_list_means_no_monitor_at_boot(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(tmp_path, "--system", str(out), config="fleet = []\n")
    assert (result.returncode, result.stderr) == (0, "")
    assert (out / "agentscope-monitor@.service").is_file()
    assert not (out / "multi-user.target.wants").exists()


def test_unknown_keys_are_reported_but_harmless(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = '[monitor]\nwatchdog = 5\n[[fleet]]\nname = "x"\nmemory = "1G"\n'
    result = run(tmp_path, "--system", str(out), config=config)
    assert result.returncode == 0
    assert "[monitor]: unknown key 'watchdog' ignored" in result.stderr
    assert "unknown key 'memory' ignored" in result.stderr
    assert (out / "multi-user.target.wants/agentscope-monitor@x.service").is_symlink()


def test_usage_error_without_output_directory(tmp_path: Path) -> None:
    result = run(tmp_path)
    assert result.returncode == 2
    assert "usage: agentscope-generator" in result.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_is_exit_0_with_an_example(tmp_path: Path, flag: str) -> None:
    result = run(tmp_path, flag)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: agentscope-generator")
    assert "Example:\n  agentscope-generator --user" in result.stdout
    assert not list(tmp_path.glob("**/*.service"))  # --help generates nothing


def test_imports_only_the_standard_library(tmp_path: Path) -> None:
    probe = textwrap.dedent(
        f"""
        import importlib.util, sys
        for name in ("dbus_fast", "psutil", "agentscope_systemd"):
            sys.modules[name] = None  # any import of these now fails
        before = set(sys.modules)
        spec = importlib.util.spec_from_file_location("gen", {str(GENERATOR)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        rc = module.main(["agentscope-generator", "--system", {str(tmp_path / "out")!r}])
        new = {{m.partition(".")[0] for m in set(sys.modules) - before}}
        bad = sorted(new - set(sys.stdlib_module_names) - {{"gen", "_genconfig"}})
        print(rc, bad)
        """
    )
    (tmp_path / "agentscope.toml").write_text(CUSTOM)  # so tomllib is imported too
    env = {"PATH": os.environ.get("PATH", ""), "AGENTSCOPE_CONFIG": "agentscope.toml"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "0 []"


def test_installed_copy_generates_the_same_files(tmp_path: Path) -> None:
    script = tmp_path / "system-generators" / "agentscope-generator"
    script.parent.mkdir()
    script.write_bytes(
        _install.generator_script(
            _install.load_templates(), agentscope_exec=generator.DEFAULT_EXEC, python=sys.executable
        )
    )
    script.chmod(0o755)
    assert script.read_text().startswith(f"#!{sys.executable} -I\n")
    out = tmp_path / "normal"
    # Run it as systemd does: executed directly, no template directory anywhere near.
    result = subprocess.run(
        [str(script), str(out), str(tmp_path / "e"), str(tmp_path / "l")],
        cwd=tmp_path,
        env={"AGENTSCOPE_CONFIG": "agentscope.toml", "SYSTEMD_LOG_TARGET": "console"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    check_golden("default-system", out)


def test_units_directory_holds_every_template() -> None:
    units = GENERATOR.parent.parent / "units"
    assert sorted(p.name for p in units.iterdir()) == sorted(generator.TEMPLATE_FILES.values())


@given(st.text(alphabet="ab.-_/ Z9é", max_size=70))
def test_fleet_name_rule_matches_the_library(name: str) -> None:
    try:
        validate_name("fleet", name)
    except InvalidName:
        assert generator.validate_fleet_name(name) is not None
    else:
        assert generator.validate_fleet_name(name) is None


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("80%", True),
        ("0%", True),
        ("100%", True),
        ("65.5%", True),
        ("99.99%", True),
        ("100.01%", False),
        ("80", False),
        ("%", False),
        ("8 0%", False),
        ("80%%", False),
        ("-1%", False),
        ("1.234%", False),
        ("٨٠%", False),
    ],
)
def test_pressure_limit_values(value: str, ok: bool) -> None:
    assert (generator.validate_pressure_limit(value) is None) is ok


_TOML_SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
)
_TOML_KEYS = st.sampled_from(
    [
        "fleet",
        "name",
        "slice",
        "monitor",
        "users",
        "exec",
        "watchdog_sec",
        "oomd_pressure_limit",
        "listen",
        "x",
    ]
) | st.text(max_size=8)
_TOML_VALUES = st.recursive(
    _TOML_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TOML_KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_TOML_KEYS, _TOML_VALUES, max_size=5))
def test_any_config_gives_a_config_and_problems(data: dict[str, object]) -> None:
    config, problems = generator.parse_config(data)
    assert isinstance(config, generator.Config)
    assert all(isinstance(p, str) for p in problems)


def _exec_start(out: Path) -> str:
    text = (out / "agentscope-monitor@.service").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    return line


def test_the_guard_is_configured_in_its_own_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = (
        "[guard]\nprocess = true\nmem_available_percent = 5\nswap_free_percent = 2.5\n"
        'psi_full_percent = "off"\npsi_full_seconds = 20\n'
    )
    result = run(tmp_path, "--system", str(out), config=config)
    assert (result.returncode, result.stderr) == (0, "")
    assert _exec_start(out).endswith(
        " monitor --guard --guard-process --guard-mem-available 5 --guard-swap-free 2.5 "
        "--guard-psi-full off --guard-psi-seconds 20"
    )
    off = tmp_path / "off"
    run(tmp_path, "--system", str(off), config="[guard]\nenabled = false\n")
    assert _exec_start(off).endswith(" monitor --no-guard")


def test_the_monitor_takes_the_guard_values_it_is_given(tmp_path: Path) -> None:
    """The ExecStart's guard options parse with the monitor's own parsers, to the same
    numbers: small ones are not written as 1e-05, which a time span is not."""
    import shlex

    from agentscope_systemd._cli._app import build_command

    out = tmp_path / "out"
    config = "[guard]\nswap_free_percent = 12.34567\npsi_full_seconds = 0.00001\n"
    assert run(tmp_path, "--system", str(out), config=config).returncode == 0
    argv = shlex.split(_exec_start(out).partition(" monitor ")[2])
    ctx = build_command("monitor").make_context("monitor", argv)
    assert ctx.params["guard_swap_free"] == 12.34567
    assert ctx.params["guard_psi_seconds"] == pytest.approx(0.00001)


def test_a_guard_value_out_of_range_falls_back_to_its_default(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = "[guard]\nmem_available_percent = 150\npsi_full_percent = 0\nenabled = 1\n"
    result = run(tmp_path, "--system", str(out), config=config)
    assert result.returncode == 0
    assert "[guard] mem_available_percent = 150 must be a number from 0 to 100" in result.stderr
    assert "[guard] psi_full_percent = 0 must be a number from 0.01 to 100" in result.stderr
    assert "[guard] enabled = 1 must be true or false" in result.stderr
    assert _exec_start(out).endswith(" monitor --guard")


@pytest.mark.parametrize("key", sorted(generator.GUARD_OPTIONS))
def test_guard_ranges_match_the_library(key: str) -> None:
    from agentscope_systemd import GuardConfig, InvalidConfig

    _, low, high = generator.GUARD_OPTIONS[key]
    GuardConfig(**{key: low})
    GuardConfig(**{key: high})
    for bad in (low - 0.001, high + 0.001):
        with pytest.raises(InvalidConfig):
            GuardConfig(**{key: bad})
