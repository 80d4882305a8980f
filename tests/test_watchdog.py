"""Tests for agentscope_systemd.watchdog: the loop stall watchdog and the fatal log.

The stalls are real (``time.sleep`` on the loop thread) because the thing
under test is a thread sampling another thread's stack; timing bounds are
wide enough for a loaded two-core VM yet fail if lag or attribution is wrong.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentscope_systemd import AgentscopeError
from agentscope_systemd.watchdog import (
    LoopWatchdog,
    StallReport,
    Stretch,
    _add_sample,
    _Run,
    _stretches,
    install_fatal_log,
)

REPO = Path(__file__).resolve().parents[1]


# -- stalls the loop runs (module level so their names are predictable) -----


def stall_once() -> None:
    time.sleep(1.5)


def stall_short() -> None:
    time.sleep(0.4)


def stall_long() -> None:
    time.sleep(0.7)


def stall_part() -> None:
    time.sleep(0.25)


def stall_in_stdlib() -> None:
    # The innermost Python frames are threading's; the report must still
    # name this function, the user code that called into the stdlib.
    threading.Event().wait(0.4)


async def stall_coroutine() -> None:
    time.sleep(0.4)  # blocking on purpose: this is the stall under test


def name_of(func: Callable[..., object]) -> str:
    """The prefix the watchdog gives ``func``: ``module:qualname``."""
    return f"{func.__module__}:{func.__qualname__} "


class Reports:
    """Collects reports from the watchdog's thread and lets a test await them."""

    def __init__(self) -> None:
        self.items: list[StallReport] = []
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def __call__(self, report: StallReport) -> None:
        self.items.append(report)
        self._loop.call_soon_threadsafe(self._changed.set)

    async def wait_for(self, count: int) -> None:
        while len(self.items) < count:
            # set() is scheduled on this loop, so it cannot slip in between
            # the check above and the clear() here.
            self._changed.clear()
            await self._changed.wait()


# -- LoopWatchdog ------------------------------------------------------------


async def test_one_stall_gives_one_report_naming_the_function() -> None:
    reports = Reports()
    loop = asyncio.get_running_loop()
    async with LoopWatchdog(window=1.0, on_report=reports):
        await asyncio.sleep(0.2)
        loop.call_soon(stall_once)
        async with asyncio.timeout(5.0):
            await reports.wait_for(1)
        # Another healthy window must not repeat the report.
        await asyncio.sleep(1.2)

    assert len(reports.items) == 1
    report = reports.items[0]
    assert report.stall_count == 1
    assert 1.4 <= report.worst_lag <= 2.0
    assert report.window_end > report.window_start
    top = report.stretches[0]
    assert top.function.startswith(name_of(stall_once))
    assert "test_watchdog.py:" in top.function
    # Sampling starts once the heartbeat is late, so it covers most of it.
    assert 1.0 <= top.seconds <= 2.0
    assert top.samples >= 50
    json.dumps(report.to_dict())


async def test_two_stalls_in_one_window_give_one_report_with_the_worst() -> None:
    reports = Reports()
    loop = asyncio.get_running_loop()
    async with LoopWatchdog(threshold=0.3, window=2.5, on_report=reports):
        await asyncio.sleep(0.1)
        loop.call_soon(stall_short)
        await asyncio.sleep(0.1)
        loop.call_soon(stall_long)
        # The report comes at the window's end, not when the watchdog stops.
        async with asyncio.timeout(5.0):
            await reports.wait_for(1)

    assert len(reports.items) == 1
    report = reports.items[0]
    assert report.stall_count == 2
    assert 0.6 <= report.worst_lag <= 1.2
    names = [s.function for s in report.stretches]
    assert names[0].startswith(name_of(stall_long))
    assert any(n.startswith(name_of(stall_short)) for n in names)


async def test_back_to_back_calls_are_one_stretch() -> None:
    reports: list[StallReport] = []
    loop = asyncio.get_running_loop()
    async with LoopWatchdog(threshold=0.3, window=30.0, on_report=reports.append):
        await asyncio.sleep(0.1)
        # Both run in the same loop iteration, one right after the other.
        loop.call_soon(stall_part)
        loop.call_soon(stall_part)
        await asyncio.sleep(0.1)
    # Stopping reports the partial window.

    assert len(reports) == 1
    report = reports[0]
    assert report.stall_count == 1
    assert 0.45 <= report.worst_lag <= 1.0
    parts = [s for s in report.stretches if s.function.startswith(name_of(stall_part))]
    assert len(parts) == 1
    # Summed across both calls: more than one call's 0.25 s.
    assert 0.35 <= parts[0].seconds <= 1.0


async def test_stall_names_user_code_not_stdlib_or_asyncio() -> None:
    reports: list[StallReport] = []
    loop = asyncio.get_running_loop()
    async with LoopWatchdog(threshold=0.3, window=30.0, on_report=reports.append):
        await asyncio.sleep(0.1)
        loop.call_soon(stall_in_stdlib)
        await asyncio.sleep(0.1)
        await stall_coroutine()
        await asyncio.sleep(0.1)

    assert len(reports) == 1
    assert reports[0].stall_count == 2
    names = {s.function.split(" ")[0] for s in reports[0].stretches}
    assert name_of(stall_in_stdlib).strip() in names
    assert name_of(stall_coroutine).strip() in names
    assert not any(n.startswith(("threading:", "asyncio")) for n in names)


async def test_healthy_loop_gives_no_report_across_many_windows() -> None:
    reports: list[StallReport] = []
    loop = asyncio.get_running_loop()
    wd = LoopWatchdog(threshold=0.5, window=0.5, on_report=reports.append)
    async with wd:
        # Busy but healthy: short sync callbacks and sleeps for a few windows.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            for _ in range(50):
                loop.call_soon(time.sleep, 0.0001)
            await asyncio.sleep(0.01)
        lag = wd.last_lag
    assert reports == []
    assert lag is not None
    assert lag < 0.5


async def test_healthy_loop_costs_one_heartbeat_per_interval_and_no_timer() -> None:
    loop = asyncio.get_running_loop()
    stamps: list[int] = []

    class Counting(LoopWatchdog):
        def _stamp(self, seq: int) -> None:
            stamps.append(seq)
            super()._stamp(seq)

    async with Counting(interval=0.05) as wd:
        await asyncio.sleep(1.0)
        # The sleep's timer has fired: the watchdog itself keeps none pending
        # (asyncio's private heap; a pending timer costs every loop turn).
        assert [h for h in loop._scheduled if not h.cancelled()] == []  # type: ignore[attr-defined]
        assert wd.last_lag is not None
        assert wd.last_lag < 0.05
    # One heartbeat per interval: about 20 in 1 s, in order, none skipped.
    assert 10 <= len(stamps) <= 22
    assert stamps == list(range(1, len(stamps) + 1))


def test_idle_time_between_runs_is_not_a_stall() -> None:
    reports: list[StallReport] = []
    loop = asyncio.new_event_loop()
    try:
        wd = LoopWatchdog(threshold=0.3, on_report=reports.append)
        wd.start(loop)
        loop.run_until_complete(asyncio.sleep(0.2))
        time.sleep(0.8)  # the loop is not running: idle, not stalled
        loop.run_until_complete(asyncio.sleep(0.3))
        wd.stop()
    finally:
        loop.close()
    assert reports == []
    assert wd.last_lag is not None
    assert wd.last_lag < 0.3


async def test_report_callback_error_is_logged_and_watching_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[StallReport] = []

    def broken(report: StallReport) -> None:
        calls.append(report)
        raise RuntimeError("callback bug")

    loop = asyncio.get_running_loop()
    async with LoopWatchdog(threshold=0.3, window=0.6, on_report=broken):
        await asyncio.sleep(0.05)
        loop.call_soon(stall_short)
        await asyncio.sleep(0.9)
        loop.call_soon(stall_short)
        await asyncio.sleep(0.1)
    assert len(calls) == 2
    assert "on_report callback failed" in caplog.text
    assert "event loop stalled" in caplog.text


async def test_lifecycle_errors() -> None:
    wd = LoopWatchdog()
    wd.start()
    with pytest.raises(AgentscopeError, match="running"):
        wd.start()
    wd.stop()
    wd.stop()
    with pytest.raises(AgentscopeError, match="stopped"):
        wd.start()


def test_start_without_a_loop_is_a_clear_error() -> None:
    with pytest.raises(AgentscopeError, match="running event loop"):
        LoopWatchdog().start()


def test_start_on_a_loop_that_runs_later() -> None:
    reports: list[StallReport] = []
    loop = asyncio.new_event_loop()
    try:
        wd = LoopWatchdog(threshold=0.3, on_report=reports.append)
        wd.start(loop)
        loop.call_later(0.1, stall_short)
        loop.run_until_complete(asyncio.sleep(0.7))
        wd.stop()
    finally:
        loop.close()
    assert len(reports) == 1
    assert reports[0].stretches[0].function.startswith(name_of(stall_short))


@pytest.mark.parametrize("bad", [{"threshold": 0}, {"window": -1.0}, {"interval": 0.0}])
def test_rejects_non_positive_settings(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        LoopWatchdog(**bad)


def test_samples_less_than_10ms_apart_coalesce_into_one_run() -> None:
    runs: list[_Run] = []
    for ts in (0.000, 0.004, 0.008, 0.0179):
        _add_sample(runs, 1, "a", ts)
    _add_sample(runs, 1, "b", 0.020)
    _add_sample(runs, 1, "a", 0.022)  # back after other work: a new run
    _add_sample(runs, 1, "a", 0.040)  # 18 ms gap: a new run
    _add_sample(runs, 2, "a", 0.041)  # next heartbeat: a new run
    assert [(r.label, r.samples) for r in runs] == [
        ("a", 4),
        ("b", 1),
        ("a", 1),
        ("a", 1),
        ("a", 1),
    ]

    stretches = _stretches(runs, period=0.002)
    assert [s.function for s in stretches] == ["a", "b"]
    a = stretches[0]
    assert a.samples == 7
    # 17.9 ms of the first run plus one period for each of the four runs.
    assert a.seconds == pytest.approx(0.0179 + 4 * 0.002)
    assert stretches[1] == Stretch("b", pytest.approx(0.002), 1)  # type: ignore[arg-type]


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from("ab"), st.floats(0.0, 0.03)),
        max_size=60,
    )
)
def test_coalescing_keeps_every_sample_and_never_bridges_a_gap(
    steps: list[tuple[int, str, float]],
) -> None:
    runs: list[_Run] = []
    ts, seq = 0.0, 0
    for seq_step, label, delay in steps:
        ts += delay
        seq += seq_step
        _add_sample(runs, seq, label, ts)
    assert sum(r.samples for r in runs) == len(steps)
    stretches = _stretches(runs, period=0.002)
    assert sum(s.samples for s in stretches) == len(steps)
    for before, after in itertools.pairwise(runs):
        # Adjacent runs differ in function or heartbeat, or a gap split them.
        assert (before.label, before.seq) != (after.label, after.seq) or (
            after.first - before.last >= 0.010
        )
    # A stretch never claims more than its runs' spans plus one period each.
    span = sum(r.last - r.first for r in runs)
    assert sum(s.seconds for s in stretches) == pytest.approx(span + 0.002 * len(runs))


def test_report_to_dict_is_json_ready() -> None:
    report = StallReport(10.0, 40.0, 1.5, 2, (Stretch("m:f (f.py:1)", 1.4, 700),))
    assert json.loads(json.dumps(report.to_dict())) == {
        "window_start": 10.0,
        "window_end": 40.0,
        "worst_lag": 1.5,
        "stall_count": 2,
        "stretches": [{"function": "m:f (f.py:1)", "seconds": 1.4, "samples": 700}],
    }


# -- install_fatal_log -------------------------------------------------------


def run_crash(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``body`` in a child Python; return it and the fatal log's text.

    The child prints its pid first so tests can check the record's pid.
    """
    log = tmp_path / "fatal.log"
    code = textwrap.dedent(
        f"""
        import asyncio, os, threading
        from agentscope_systemd.watchdog import install_fatal_log
        print(os.getpid(), flush=True)
        LOG = {str(log)!r}
        """
    ) + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc, log.read_text(encoding="utf-8") if log.exists() else ""


def test_fatal_log_main_thread(tmp_path: Path) -> None:
    proc, text = run_crash(
        tmp_path,
        """
        install_fatal_log(LOG)
        def deep():
            raise ValueError("boom in main")
        deep()
        """,
    )
    assert proc.returncode == 1
    assert f"pid={proc.stdout.split()[0]} where=main thread: ValueError: boom in main" in text
    assert "Traceback (most recent call last):" in text
    assert "in deep" in text
    # The previous hook still ran: the traceback reached stderr too.
    assert "ValueError: boom in main" in proc.stderr


def test_fatal_log_other_thread(tmp_path: Path) -> None:
    proc, text = run_crash(
        tmp_path,
        """
        install_fatal_log(LOG)
        def work():
            raise KeyError("lost key")
        t = threading.Thread(target=work, name="worker-7")
        t.start()
        t.join()
        """,
    )
    assert "where=thread worker-7: KeyError: 'lost key'" in text
    assert "in work" in text
    assert "KeyError" in proc.stderr


def test_fatal_log_event_loop(tmp_path: Path) -> None:
    proc, text = run_crash(
        tmp_path,
        """
        class HarnessDied(Exception):
            pass
        def bad():
            raise HarnessDied("loop callback failed")
        loop = asyncio.new_event_loop()
        install_fatal_log(LOG, loop=loop)
        loop.call_soon(bad)
        loop.call_later(0.05, loop.stop)
        loop.run_forever()
        loop.close()
        """,
    )
    assert "where=event loop: HarnessDied: loop callback failed" in text
    assert "context: Exception in callback bad()" in text
    assert "in bad" in text
    # Chained to the default handler, which logs to stderr.
    assert "Exception in callback bad()" in proc.stderr


def test_fatal_log_uninstall_restores_hooks(tmp_path: Path) -> None:
    before_sys, before_thread = sys.excepthook, threading.excepthook
    loop = asyncio.new_event_loop()
    try:
        with install_fatal_log(tmp_path / "f.log", loop=loop) as fatal:
            assert sys.excepthook is not before_sys
            assert threading.excepthook is not before_thread
            assert loop.get_exception_handler() is not None
            assert fatal.installed
        assert not fatal.installed
        assert sys.excepthook is before_sys
        assert threading.excepthook is before_thread
        assert loop.get_exception_handler() is None
        fatal.uninstall()
    finally:
        loop.close()


def test_fatal_log_rotates_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "fatal.log"
    with install_fatal_log(path, max_bytes=2_000, backups=2) as fatal:
        for i in range(40):
            try:
                raise OSError(f"disk gone {i}")
            except OSError as exc:
                fatal.record(exc, where="main thread")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["fatal.log", "fatal.log.1", "fatal.log.2"]
    assert all((tmp_path / f).stat().st_size <= 2_000 for f in files)
    assert "disk gone 39" in path.read_text(encoding="utf-8")


def test_fatal_log_rejects_bad_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        install_fatal_log(tmp_path / "f.log", max_bytes=0)
