"""The VM runner (integration/vm.py) tells a stuck VM from a slow one (issue #29).

On this project's own machine kind /dev/kvm opens, but the guest dies of an
emulation failure and qemu *pauses* it instead of exiting: a runner that
falls back to TCG only when qemu exits waits out its whole timeout. These
tests run the runner's boot loop over a stand-in qemu (a shell script on
PATH) that behaves as that host's does under KVM and boots under TCG.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
import images
import vm

# A stand-in for qemu-system-x86_64: $MODE_KVM says what it does under KVM
# (pause: print KVM's internal error and hang, as qemu does when it pauses the
# guest; silent: hang without a word and without CPU; spin: run 3 s without a
# word, then boot; boot: run); under TCG it always boots,
# after $TCG_DELAY seconds, and prints the payload's status on the second serial.
FAKE_QEMU = r"""#!/bin/sh
accel=""; serials=""
while [ $# -gt 0 ]; do
    case "$1" in
    -accel) accel=$2; shift ;;
    -serial) serials="$serials ${2#file:}"; shift ;;
    esac
    shift
done
set -- $serials
console=$1; out=$2
echo "$accel" >> "$FAKE_LOG"
case "$accel" in
kvm*)
    case "$MODE_KVM" in
    pause)
        echo "KVM internal error. Suberror: 1" >&2
        echo "emulation failure" >&2
        exec sleep 600 ;;
    silent) exec sleep 600 ;;
    spin)
        # A guest that runs but says nothing for 3 s: CPU, no output.
        (sleep 3; touch "$FAKE_LOG.go") &
        while [ ! -e "$FAKE_LOG.go" ]; do :; done ;;
    esac ;;
esac
sleep "${TCG_DELAY:-0}"
echo "[    0.000000] Linux version 6.12" >> "$console"
once=""; [ -e "$FAKE_LOG.panicked" ] && once=done
if [ "${TCG_END:-}" = panic ] || { [ "${TCG_END:-}" = panic-once ] && [ -z "$once" ]; }; then
    touch "$FAKE_LOG.panicked"
    printf '==== fake (systemd 257) system manager ====\n' >> "$out"
    printf 'tests/test_hosts.py::test_a_runaway[ubuntu one] PASSED [ 40%%]\n' >> "$out"
    printf 'tests/test_hosts.py::test_two_guards FAILED [ 41%%]\n' >> "$out"
    # pytest ends a test's line only when the test ends.
    printf 'tests/test_launch.py::test_global_oom_kills_only_the_runaway ' >> "$out"
    echo "[  812.000000] Kernel panic - not syncing: Fatal exception" >> "$console"
    exit 0
fi
if [ "${TCG_END:-}" = panic-once ]; then
    printf '==== fake (systemd 257) system manager ====\n' >> "$out"
    printf '===== 30 passed in 90.10s =====\n' >> "$out"
    printf '==== fake (systemd 257) user manager ====\n' >> "$out"
    printf '===== 41 passed, 2 skipped in 120.10s =====\n' >> "$out"
    printf '@@AGENTSCOPE-STATUS system=0 user=0@@\n' >> "$out"
    exit 0
fi
printf '==== fake (systemd 257) system manager ====\n' >> "$out"
printf '===== 1 passed in 0.10s =====\n' >> "$out"
printf '@@AGENTSCOPE-STATUS system=0@@\n' >> "$out"
"""


@pytest.fixture
def fake_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    qemu = bindir / "qemu-system-x86_64"
    qemu.write_text(FAKE_QEMU)
    qemu.chmod(0o755)
    log = tmp_path / "accels"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(images, "CACHE_DIR", cache)
    distro = images.DISTROS["trixie"]
    image = images.Image(distro, tmp_path / "root.img", tmp_path / "vmlinuz", tmp_path / "initrd")
    monkeypatch.setattr(images, "ensure_image", lambda name, rebuild=False: image)

    def payload(work: Path, *args: object, **kwargs: object) -> Path:
        (work / "payload").mkdir()
        (work / "payload.img").write_bytes(b"")
        with (tmp_path / "payloads").open("a") as f:
            f.write(f"{args[1]} {kwargs.get('deselect')}\n")
        return work / "payload.img"

    monkeypatch.setattr(vm, "_payload", payload)
    monkeypatch.setattr(vm, "_kvm_usable", lambda: True)
    return log


def boot(**kwargs: object) -> dict[str, vm.Result]:
    return vm.boot("trixie", ["system"], [], timeout=120, memory="768M", **kwargs)  # type: ignore[arg-type]


def test_a_guest_that_kvm_paused_falls_back_to_tcg_at_once(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MODE_KVM", "pause")
    t0 = time.monotonic()
    results = boot()
    took = time.monotonic() - t0
    assert results["system"][0] == 0, results
    assert fake_qemu.read_text().split() == ["kvm", "tcg,thread=single"]
    assert took < 15, f"the runner waited {took:.0f}s on a paused guest"
    err = capsys.readouterr().err
    assert "KVM did not work here (qemu paused the guest: KVM internal error" in err
    assert "ran under TCG" in err


def test_a_guest_silent_under_kvm_falls_back_after_the_bound(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MODE_KVM", "silent")
    monkeypatch.setitem(vm._SILENCE, "kvm", 2.0)
    t0 = time.monotonic()
    results = boot()
    assert results["system"][0] == 0, results
    assert time.monotonic() - t0 < 15
    assert fake_qemu.read_text().split() == ["kvm", "tcg,thread=single"]
    assert "no console output in" in capsys.readouterr().err


def test_a_kvm_guest_that_never_runs_falls_back_to_tcg_before_the_silence_bound(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # bookworm's kernel under KVM on this machine kind: no word, no CPU.
    monkeypatch.setenv("MODE_KVM", "silent")
    monkeypatch.setattr(vm, "_KVM_IDLE", 1.0)
    t0 = time.monotonic()
    results = boot()
    assert results["system"][0] == 0, results
    assert time.monotonic() - t0 < 15, "the runner waited for the silence bound (45 s)"
    assert fake_qemu.read_text().split() == ["kvm", "tcg,thread=single"]
    assert "KVM did not work here (its vCPUs ran the guest 0.00s in" in capsys.readouterr().err


def test_a_kvm_guest_that_runs_without_a_word_is_kept(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODE_KVM", "spin")
    monkeypatch.setattr(vm, "_KVM_IDLE", 1.0)
    # A shell has no vCPU: its CPU stands for the time a guest would have run.
    monkeypatch.setattr(vm._CpuSampler, "guest", vm._CpuSampler.read)
    results = boot()
    assert results["system"][0] == 0, results
    assert fake_qemu.read_text().split() == ["kvm"]


def test_a_slow_guest_is_not_taken_for_a_stuck_one(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TCG takes longer than KVM's bound would allow: only its own bound counts.
    monkeypatch.setenv("MODE_KVM", "pause")
    monkeypatch.setenv("TCG_DELAY", "4")
    monkeypatch.setitem(vm._SILENCE, "kvm", 1.0)
    results = boot()
    assert results["system"][0] == 0, results
    assert fake_qemu.read_text().split() == ["kvm", "tcg,thread=single"]


def test_a_working_kvm_is_kept(fake_qemu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODE_KVM", "boot")
    results = boot()
    assert results["system"][0] == 0, results
    assert fake_qemu.read_text().split() == ["kvm"]


def test_a_guest_silent_under_tcg_is_booted_once_more_then_given_up(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TCG_DELAY", "30")
    monkeypatch.setitem(vm._SILENCE, "tcg", 1.5)
    t0 = time.monotonic()
    results = boot(accel="tcg")
    assert time.monotonic() - t0 < 15
    assert results["system"][0] != 0
    assert fake_qemu.read_text().split() == ["tcg,thread=single"] * 2
    err = capsys.readouterr().err
    assert "booting again" in err
    assert "giving up on this VM" in err


def test_a_guest_that_died_mid_suite_says_where_in_the_matrix(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # CI's log is read from its end: the matrix's line must say why and where,
    # not only "see the console log above". The guest panics again when booted
    # once more for the rest, and the runner gives up after that second boot.
    monkeypatch.setenv("TCG_END", "panic")
    results = vm.boot("trixie", ["system", "user"], [], timeout=600, memory="768M", accel="tcg")
    code, summary, _ = results["system"]
    assert code != 0
    assert summary.startswith("no result: the VM ended after"), summary
    assert "last test: tests/test_launch.py::test_global_oom_kills_only_the_runaway" in summary
    assert "guest console: Kernel panic - not syncing: Fatal exception" in summary
    code, summary, _ = results["user"]
    assert code != 0
    assert "its suite never started" in summary, summary
    assert fake_qemu.read_text().split() == ["tcg,thread=single"] * 2
    err = capsys.readouterr().err
    assert "booting once more for them, without the 2 tests that had ended" in err
    assert "Kernel panic - not syncing: Fatal exception" in err


def test_a_guest_kernel_panic_mid_suite_is_booted_once_more_for_the_rest(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TCG_END", "panic-once")
    results = vm.boot("trixie", ["system", "user"], [], timeout=600, memory="768M", accel="tcg")
    # The second boot ran the system suite without the two tests that had
    # ended, and the whole user suite.
    payloads = (tmp_path / "payloads").read_text().splitlines()
    assert payloads[0] == "['system', 'user'] None"
    assert payloads[1] == (
        "['system', 'user'] {'system': ['tests/test_hosts.py::test_a_runaway[ubuntu one]', "
        "'tests/test_hosts.py::test_two_guards'], 'user': []}"
    )
    code, summary, failures = results["system"]
    # A test that failed before the panic still fails the suite, and is named.
    assert code == 1
    assert summary == "30 passed; before the guest kernel panicked: 1 failed, 1 passed"
    assert failures == ["FAILED tests/test_hosts.py::test_two_guards (before the reboot)"]
    assert results["user"] == (
        0,
        "41 passed, 2 skipped (booted again: the guest kernel panicked)",
        [],
    )


def test_a_guest_without_a_panic_is_not_booted_again(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TCG_END", "quiet-death")
    results = vm.boot("trixie", ["system"], [], timeout=600, memory="768M", accel="tcg")
    assert results["system"][0] == 0  # the fake's usual boot: a status line
    assert fake_qemu.read_text().split() == ["tcg,thread=single"]


def test_sid_runs_under_single_threaded_tcg(
    fake_qemu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sid's kernel panicked under multi-threaded TCG (vm._TCG_SINGLE_THREAD).
    image = images.Image(images.DISTROS["sid"], Path("root"), Path("k"), Path("i"))
    monkeypatch.setattr(images, "ensure_image", lambda name, rebuild=False: image)
    results = vm.boot("sid", ["system"], [], timeout=120, memory="768M", accel="tcg")
    assert results["system"][0] == 0
    assert fake_qemu.read_text().split() == ["tcg,thread=single"]


def test_qemus_cpu_is_read_while_it_runs_and_kept_after_it_ends() -> None:
    # The runner says how much of a core each VM kept busy (make test's JOBS
    # rests on it); qemu is reaped before the runner sees it end, so the last
    # reading taken while it ran is the figure.
    import subprocess

    burn = (
        "import time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\ntime.sleep(30)"
    )
    burner = subprocess.Popen([sys.executable, "-c", burn])
    try:
        cpu = vm._CpuSampler(burner.pid)
        deadline = time.monotonic() + 10
        while cpu.seconds < 0.4 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        burner.kill()
        burner.wait()
    assert 0.4 <= cpu.stop() <= 1.5
    gone = vm._CpuSampler(burner.pid)  # reaped: no /proc entry, and no error
    assert gone.stop() == 0.0


def test_every_library_name_the_vm_tests_and_benchmarks_import_exists() -> None:
    # The VM suites import private names (a Mover, a _Loop, a bus's constants)
    # and only collect inside a guest: a rename in the library broke all eight
    # suites at collection in a rehearsal, 7 minutes in. Checked here in 1 s.
    import ast
    import importlib

    root = Path(__file__).resolve().parent.parent
    missing: list[str] = []
    for path in sorted(
        [*(root / "integration").rglob("*.py"), *(root / "benchmarks").rglob("*.py")]
    ):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if node.level or not node.module.startswith("agentscope_systemd"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    continue
                try:  # a submodule: from agentscope_systemd._fleet import _tmux
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(
                        f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}"
                    )
    assert missing == []
