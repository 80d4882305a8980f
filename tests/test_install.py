"""Install and uninstall plans: exactly these files, applied into a fake root, undone cleanly."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from agentscope import _install, generator
from agentscope._errors import InstallError, InvalidName
from agentscope._install import apply_plan, plan_install, plan_uninstall

EXEC = "/opt/agentscope/bin/agentscope"
HOME = PurePosixPath("/home/alice")
GEN = "/usr/local/lib/systemd/{}-generators/agentscope-generator"
USER_UNITS = "/home/alice/.config/systemd/user"
#: systemd-oomd's drop-ins of a user install (numbered after the distributions' 10-).
OOMD_DROPINS = [
    f"{USER_UNITS}/{unit}.d/50-agentscope-oomd.conf"
    for unit in (
        "app-agentscope-agents.slice",
        "app-agentscope.slice",
        "agentscope-.scope",
        "agentscope-monitor@.service",
    )
]


def tree(top: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every file, symlink and directory under ``top``."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(top.rglob("*")):
        rel = str(path.relative_to(top))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", b"")
        else:
            out[rel] = ("file", path.read_bytes())
    return out


def system_plan(
    root: Path, version: int | None = 252, fleets: tuple[str, ...] = ("default",)
) -> _install.InstallPlan:
    return plan_install(
        "system",
        root=root,
        systemd_version=version,
        linger=False,
        fleets=list(fleets),
        agentscope_exec=EXEC,
        python=sys.executable,
    )


def user_plan(root: Path, version: int | None = 252, linger: bool = False) -> _install.InstallPlan:
    return plan_install(
        "user",
        root=root,
        home=HOME,
        systemd_version=version,
        linger=linger,
        fleets=["default", "ci"],
        agentscope_exec=EXEC,
        user="alice",
    )


@pytest.mark.parametrize(
    ("version", "dropins"),
    [(247, True), (252, True), (None, True), (253, False), (257, False)],
)
def test_system_plan_lists_exactly_these_files(
    tmp_path: Path, version: int | None, dropins: bool
) -> None:
    plan = system_plan(tmp_path, version, ("default", "ci", "default"))
    expected = {
        GEN.format("system"),
        GEN.format("user"),
        "/etc/agentscope/agentscope.toml",
    }
    if dropins:
        expected |= {
            "/etc/systemd/system.conf.d/60-agentscope-oom-policy.conf",
            "/etc/systemd/user.conf.d/60-agentscope-oom-policy.conf",
        }
    assert {str(f.path) for f in plan.files} == expected
    assert plan.actions == (
        ("systemctl", "daemon-reload"),
        ("systemctl", "start", "agentscope-monitor@default.service"),
        ("systemctl", "start", "agentscope-monitor@ci.service"),
    )
    assert str(plan.manifest) == "/var/lib/agentscope/install-manifest.json"
    modes = {str(f.path): f.mode for f in plan.files}
    assert modes[GEN.format("system")] == 0o755
    assert not list(tmp_path.iterdir()), "planning must not write"


@pytest.mark.parametrize(("version", "dropin"), [(252, True), (None, True), (262, False)])
def test_user_plan_lists_exactly_these_files(
    tmp_path: Path, version: int | None, dropin: bool
) -> None:
    plan = user_plan(tmp_path, version, linger=True)
    expected = {
        f"{USER_UNITS}/app-agentscope-agents.slice",
        f"{USER_UNITS}/agentscope-monitor@.service",
        f"{USER_UNITS}/default.target.wants/agentscope-monitor@default.service",
        f"{USER_UNITS}/default.target.wants/agentscope-monitor@ci.service",
        *OOMD_DROPINS,
    }
    if dropin:
        expected.add("/home/alice/.config/systemd/user.conf.d/60-agentscope-oom-policy.conf")
    assert {str(f.path) for f in plan.files} == expected
    assert plan.actions == (
        ("systemctl", "--user", "daemon-reload"),
        ("systemctl", "--user", "start", "agentscope-monitor@default.service"),
        ("systemctl", "--user", "start", "agentscope-monitor@ci.service"),
        ("loginctl", "enable-linger", "alice"),
    )
    assert str(plan.manifest) == "/home/alice/.local/state/agentscope/install-manifest.json"


def test_dry_run_lists_and_writes_nothing(tmp_path: Path) -> None:
    lines = apply_plan(system_plan(tmp_path), dry_run=True)
    assert f"write {GEN.format('system')} (0755)" in lines
    assert "write /etc/systemd/system.conf.d/60-agentscope-oom-policy.conf (0644)" in lines
    assert "record /var/lib/agentscope/install-manifest.json" in lines
    assert lines[-2:] == [
        "run: systemctl daemon-reload",
        "run: systemctl start agentscope-monitor@default.service",
    ]
    assert list(tmp_path.iterdir()) == []


def test_system_install_then_uninstall_leaves_nothing(tmp_path: Path) -> None:
    plan = system_plan(tmp_path)
    apply_plan(plan)
    generated = tmp_path / GEN.format("system").lstrip("/")
    assert stat.S_IMODE(generated.stat().st_mode) == 0o755
    dropin = tmp_path / "etc/systemd/system.conf.d/60-agentscope-oom-policy.conf"
    assert "[Manager]\nDefaultOOMPolicy=continue\n" in dropin.read_text()
    config, problems = generator.load_config(str(tmp_path / "etc/agentscope/agentscope.toml"))
    assert problems == []
    assert config.monitor_exec == EXEC
    assert [f.name for f in config.fleets] == ["default"]
    manifest = json.loads((tmp_path / "var/lib/agentscope/install-manifest.json").read_text())
    assert len(manifest["files"]) == 5

    # The installed generator, run on the installed config, makes the units.
    out = tmp_path / "run/systemd/generator"
    env = {
        "AGENTSCOPE_CONFIG": str(tmp_path / "etc/agentscope/agentscope.toml"),
        "SYSTEMD_LOG_TARGET": "console",
        "SYSTEMD_SCOPE": "system",
    }
    subprocess.run([str(generated), str(out)], env=env, check=True, timeout=60)
    monitor = (out / "agentscope-monitor@.service").read_text()
    # The installed config spells out the guard's defaults, so the unit does too.
    guard = (
        "--guard --guard-mem-available 10 --guard-swap-free 20 --guard-psi-full 60 "
        "--guard-psi-seconds 10"
    )
    assert f"\nExecStart={EXEC} --manager system --fleet %i monitor {guard}\n" in monitor
    assert (out / "multi-user.target.wants/agentscope-monitor@default.service").is_symlink()
    for path in sorted(out.rglob("*"), reverse=True):  # not part of the install
        path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    for d in (out, out.parent, out.parent.parent):
        d.rmdir()

    manifest_obj = _install.load_manifest("system", root=tmp_path)
    assert manifest_obj is not None
    uninstall = plan_uninstall(manifest_obj)
    assert uninstall.actions[-1] == ("systemctl", "daemon-reload")
    assert ("systemctl", "stop", "agentscope-monitor@default.service") in uninstall.actions
    apply_plan(uninstall)
    assert tree(tmp_path) == {}


def test_user_install_then_uninstall_leaves_nothing(tmp_path: Path) -> None:
    apply_plan(user_plan(tmp_path))
    units = tmp_path / USER_UNITS.lstrip("/")
    link = units / "default.target.wants/agentscope-monitor@ci.service"
    assert os.readlink(link) == "../agentscope-monitor@.service"
    monitor = (units / "agentscope-monitor@.service").read_text()
    assert f"\nExecStart={EXEC} --manager user --fleet %i monitor --guard\n" in monitor
    assert "\nWantedBy=default.target\n" in monitor
    assert "\nSlice=app-agentscope.slice\n" in monitor
    assert (units / "app-agentscope-agents.slice").is_file()
    manifest = _install.load_manifest("user", root=tmp_path, home=HOME)
    assert manifest is not None
    apply_plan(plan_uninstall(manifest))
    assert tree(tmp_path) == {}


def test_user_install_writes_the_oomd_drop_ins_and_uninstall_removes_them(
    tmp_path: Path,
) -> None:
    lines = apply_plan(user_plan(tmp_path, 257))
    for path in OOMD_DROPINS:
        assert f"write {path} (0644)" in lines
    units = tmp_path / USER_UNITS.lstrip("/")
    agents = (units / "app-agentscope-agents.slice.d/50-agentscope-oomd.conf").read_text()
    assert "\n[Slice]\n" in agents
    for line in (
        "ManagedOOMMemoryPressure=kill",
        "ManagedOOMMemoryPressureLimit=80%",
        "ManagedOOMSwap=auto",
        "ManagedOOMPreference=avoid",
    ):
        assert f"\n{line}\n" in agents
    scopes = (units / "agentscope-.scope.d/50-agentscope-oomd.conf").read_text()
    assert "\n[Scope]\nManagedOOMPreference=avoid\n" in scopes
    monitor = (units / "agentscope-monitor@.service.d/50-agentscope-oomd.conf").read_text()
    assert "\n[Service]\nManagedOOMPreference=avoid\n" in monitor
    parent = (units / "app-agentscope.slice.d/50-agentscope-oomd.conf").read_text()
    assert "\nManagedOOMMemoryPressure=auto\nManagedOOMSwap=auto\n" in parent
    # A distribution's 10- drop-in beside ours sorts first: ours wins.
    fedora = units / "app-agentscope-agents.slice.d/10-oomd-per-slice-defaults.conf"
    fedora.write_text("[Slice]\nManagedOOMMemoryPressure=kill\n")
    assert sorted(p.name for p in fedora.parent.iterdir())[-1] == "50-agentscope-oomd.conf"
    manifest = _install.load_manifest("user", root=tmp_path, home=HOME)
    assert manifest is not None
    lines = apply_plan(plan_uninstall(manifest))
    for path in OOMD_DROPINS:
        assert f"remove {path}" in lines
        assert not (tmp_path / path.lstrip("/")).exists()
    # The distribution's file stays, and so does the directory that holds it.
    assert fedora.is_file()
    assert not (units / "agentscope-.scope.d").exists()


def test_system_install_s_generator_writes_the_oomd_drop_ins(tmp_path: Path) -> None:
    apply_plan(system_plan(tmp_path, 257))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / GEN.format("system").lstrip("/")), str(out)],
        env={"AGENTSCOPE_CONFIG": str(tmp_path / "etc/agentscope/agentscope.toml")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for unit in ("app-agentscope-agents.slice", "app-agentscope.slice", "agentscope-.scope"):
        assert (out / f"{unit}.d/50-agentscope-oomd.conf").is_file()
    text = (out / "agentscope-monitor@.service.d/50-agentscope-oomd.conf").read_text()
    assert "ManagedOOMPreference=avoid" in text


def test_pre_existing_files_survive_install_and_uninstall(tmp_path: Path) -> None:
    config = tmp_path / "etc/agentscope/agentscope.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[[fleet]]\nname = "mine"\n')
    conf_d = tmp_path / "etc/systemd/system.conf.d"
    conf_d.mkdir(parents=True)
    (conf_d / "10-admin.conf").write_text("[Manager]\n")
    before = tree(tmp_path)

    lines = apply_plan(system_plan(tmp_path))
    assert any(line.startswith("keep existing /etc/agentscope/agentscope.toml") for line in lines)
    assert config.read_text() == '[[fleet]]\nname = "mine"\n'
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    assert "/etc/agentscope/agentscope.toml" not in {str(e.path) for e in manifest.files}

    apply_plan(plan_uninstall(manifest))
    assert tree(tmp_path) == before


def test_conflicting_file_stops_the_install_before_any_write(tmp_path: Path) -> None:
    units = tmp_path / USER_UNITS.lstrip("/")
    units.mkdir(parents=True)
    (units / "agentscope-monitor@.service").write_text("[Service]\nExecStart=/bin/true\n")
    before = tree(tmp_path)
    with pytest.raises(InstallError, match=r"did not install: .*agentscope-monitor@\.service"):
        apply_plan(user_plan(tmp_path))
    assert tree(tmp_path) == before


def test_identical_pre_existing_file_is_kept_not_taken_over(tmp_path: Path) -> None:
    plan = user_plan(tmp_path)
    slice_file = next(f for f in plan.files if f.path.name == "app-agentscope-agents.slice")
    real = tmp_path / str(slice_file.path).lstrip("/")
    real.parent.mkdir(parents=True)
    real.write_bytes(slice_file.content)
    apply_plan(plan)
    manifest = _install.load_manifest("user", root=tmp_path, home=HOME)
    assert manifest is not None
    apply_plan(plan_uninstall(manifest))
    assert real.read_bytes() == slice_file.content


def test_file_changed_after_install_is_kept_by_uninstall(tmp_path: Path) -> None:
    apply_plan(system_plan(tmp_path))
    config = tmp_path / "etc/agentscope/agentscope.toml"
    config.write_text(config.read_text() + '\n[[fleet]]\nname = "added"\n')
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    lines = apply_plan(plan_uninstall(manifest))
    assert "keep /etc/agentscope/agentscope.toml (changed since install)" in lines
    assert "added" in config.read_text()
    remaining = {k for k, v in tree(tmp_path).items() if v[0] != "dir"}
    assert remaining == {"etc/agentscope/agentscope.toml"}


def test_reinstall_is_idempotent_and_upgrade_drops_stale_files(tmp_path: Path) -> None:
    apply_plan(system_plan(tmp_path, 252))
    first = tree(tmp_path)
    lines = apply_plan(system_plan(tmp_path, 252))
    assert tree(tmp_path) == first
    assert not any(line.startswith("write ") for line in lines)
    # systemd upgraded to 253: the drop-ins are no longer needed.
    apply_plan(system_plan(tmp_path, 255))
    assert not (tmp_path / "etc/systemd/system.conf.d/60-agentscope-oom-policy.conf").exists()
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    apply_plan(plan_uninstall(manifest))
    assert tree(tmp_path) == {}


def test_damaged_manifest_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "var/lib/agentscope/install-manifest.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(InstallError, match="unreadable install manifest"):
        _install.load_manifest("system", root=tmp_path)
    assert _install.load_manifest("user", root=tmp_path, home=HOME) is None


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidName):
        plan_install(
            "user",
            root=tmp_path,
            home=HOME,
            systemd_version=255,
            linger=False,
            fleets=["../etc"],
            agentscope_exec=EXEC,
        )
    with pytest.raises(ValueError, match="linger"):
        plan_install(
            "system",
            root=tmp_path,
            systemd_version=255,
            linger=True,
            fleets=[],
            agentscope_exec=EXEC,
        )
    with pytest.raises(ValueError, match="absolute"):
        plan_install(
            "system",
            root=tmp_path,
            systemd_version=255,
            linger=False,
            fleets=[],
            agentscope_exec="agentscope",
        )


def test_no_fleets_writes_an_explicitly_empty_fleet_list(tmp_path: Path) -> None:
    plan = system_plan(tmp_path, fleets=())
    apply_plan(plan)
    config, problems = generator.load_config(str(tmp_path / "etc/agentscope/agentscope.toml"))
    assert (config.fleets, problems) == ((), [])
    assert plan.actions == (("systemctl", "daemon-reload"),)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["usr/lib/systemd/libsystemd-shared-252.so"], 252),
        (["lib/systemd/libsystemd-shared-247.so"], 247),
        (["usr/lib64/systemd/libsystemd-shared-255.5-1.fc40.so"], 255),
        (["usr/lib/x86_64-linux-gnu/systemd/libsystemd-shared-257.13-1.so"], 257),
        (
            [
                "usr/lib/systemd/libsystemd-shared-252.so",
                "usr/lib/systemd/libsystemd-shared-257.so",
            ],
            257,
        ),
        (["usr/lib/systemd/libsystemd-core-257.so"], None),
        ([], None),
    ],
)
def test_systemd_version_from_library_names(
    tmp_path: Path, names: list[str], expected: int | None
) -> None:
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert _install.detect_systemd_version(tmp_path) == expected


def test_user_install_on_247_says_the_home_drop_in_may_not_apply(tmp_path: Path) -> None:
    old = user_plan(tmp_path, version=247)
    assert any(f.path.name == "60-agentscope-oom-policy.conf" for f in old.files)
    assert any("247 does not" in note and "--system" in note for note in old.notes)
    assert not any("user.conf.d" in note for note in user_plan(tmp_path, version=252).notes)


def test_mglru_protection_is_an_opt_in_that_uninstall_removes(tmp_path: Path) -> None:
    tmpfiles = tmp_path / "etc/tmpfiles.d/agentscope-mglru.conf"
    apply_plan(system_plan(tmp_path))
    assert not tmpfiles.exists(), "not without asking"
    plan = plan_install(
        "system",
        root=tmp_path,
        systemd_version=257,
        linger=False,
        fleets=["default"],
        agentscope_exec=EXEC,
        python=sys.executable,
        mglru_min_ttl_ms=1000,
    )
    assert ("systemd-tmpfiles", "--create", "/etc/tmpfiles.d/agentscope-mglru.conf") in (
        plan.actions
    )
    apply_plan(plan)
    lines = [x for x in tmpfiles.read_text().splitlines() if not x.startswith("#")]
    assert lines == [
        "w /sys/kernel/mm/lru_gen/enabled - - - - y",
        "w /sys/kernel/mm/lru_gen/min_ttl_ms - - - - 1000",
    ]
    manifest = _install.load_manifest("system", root=tmp_path)
    assert manifest is not None
    uninstall = plan_uninstall(manifest)
    # The running kernel gets Debian's default (off) back at once, not at the next boot.
    assert uninstall.actions[-1][:2] == ("sh", "-c")
    assert "echo 0 > /sys/kernel/mm/lru_gen/min_ttl_ms" in uninstall.actions[-1][2]
    apply_plan(uninstall)
    assert tree(tmp_path) == {}


def test_mglru_protection_refuses_bad_values_and_user_installs(tmp_path: Path) -> None:
    for bad in (0, 99, 60_001, True, 1000.0):
        with pytest.raises(ValueError, match=r"mglru_min_ttl_ms must be an integer 100\.\.60000"):
            _install.mglru_protection(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="system install only"):
        plan_install(
            "user",
            root=tmp_path,
            home=HOME,
            systemd_version=257,
            linger=False,
            fleets=[],
            agentscope_exec=EXEC,
            mglru_min_ttl_ms=1000,
        )
