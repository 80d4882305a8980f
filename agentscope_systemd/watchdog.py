"""Harness stability kit: an event-loop stall watchdog and a fatal-reason log.

Two independent tools for a long-running harness:

:class:`LoopWatchdog`
    Measures how late the asyncio loop runs and, when it stalls past a
    threshold, reports the worst lag of the window together with the
    synchronous functions that held the loop.

:func:`install_fatal_log`
    Writes the reason a process died (uncaught exception in the main thread,
    in another thread, or in the event loop) to a bounded, rotated file.

How the watchdog works, and why it is cheap: nothing is scheduled on the loop
but a tiny heartbeat callback. A daemon thread posts it with
``loop.call_soon_threadsafe`` every ``interval`` seconds; the callback stamps
the time it ran, and the lag is that time less the time it was posted. When
the thread wakes and finds the previous heartbeat has not run yet, the loop
is late, and only then does the thread wake every ``sample_interval`` seconds
to sample the loop thread's stack with :func:`sys._current_frames`. A healthy
loop therefore costs one thread wake-up and one callback per interval, and no
pending timer (with any timer pending, asyncio reads the clock and its timer
heap on every loop iteration).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import logging.handlers
import os
import selectors
import sys
import sysconfig
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ._dicts import Record
from ._errors import AgentscopeError

__all__ = [
    "FatalLog",
    "LoopWatchdog",
    "StallReport",
    "Stretch",
    "install_fatal_log",
]

logger = logging.getLogger("agentscope.watchdog")

#: Samples of the same function less than this far apart are one stretch.
COALESCE_GAP = 0.010

#: The longest default heartbeat period (seconds); shorter for a low threshold.
DEFAULT_INTERVAL = 0.25


# ---------------------------------------------------------------------------
# Reports (plain data, no I/O)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Stretch(Record):
    """Time one function held the event loop during a window's stalls.

    ``function`` reads ``"module:qualname (file:line)"`` where ``line`` is the
    line the function is defined on, so every sample of one function has the
    same name. ``seconds`` sums the function's runs of back-to-back samples
    (samples less than 10 ms apart); ``samples`` counts them.
    """

    function: str
    seconds: float
    samples: int


@dataclass(frozen=True)
class StallReport(Record):
    """The worst event-loop stall of one window, and what held the loop.

    ``window_start`` and ``window_end`` are Unix times (seconds). A report is
    made only for a window in which the loop's lag reached the threshold;
    ``stall_count`` counts the lags that did, ``worst_lag`` is the largest in
    seconds, and ``stretches`` lists the functions sampled on the loop thread
    while it was late, most time first.
    """

    window_start: float
    window_end: float
    worst_lag: float
    stall_count: int
    stretches: tuple[Stretch, ...]

    def describe(self) -> str:
        """Return a one-line human summary, as logged by the watchdog."""
        held = "; ".join(
            f"{s.function} {s.seconds:.3f} s ({s.samples} samples)" for s in self.stretches
        )
        return (
            f"event loop stalled {self.stall_count} time(s) in "
            f"{self.window_end - self.window_start:.1f} s; worst lag {self.worst_lag:.3f} s; "
            f"held by: {held or 'nothing sampled'}"
        )


class _Run:
    """Back-to-back samples of one function (mutable, watcher thread only)."""

    __slots__ = ("first", "label", "last", "samples", "seq")

    def __init__(self, seq: int, label: str, ts: float) -> None:
        self.seq = seq
        self.label = label
        self.first = ts
        self.last = ts
        self.samples = 1


def _add_sample(
    runs: list[_Run], seq: int, label: str, ts: float, gap: float = COALESCE_GAP
) -> None:
    """Append one stack sample to ``runs``, extending the last run when back-to-back.

    A sample extends the last run when it names the same function, waits on
    the same heartbeat ``seq`` and comes less than ``gap`` seconds after it;
    otherwise it starts a new run. Keeping runs instead of samples bounds
    memory when the loop is stuck for a long time.
    """
    if runs:
        last = runs[-1]
        if last.seq == seq and last.label == label and ts - last.last < gap:
            last.last = ts
            last.samples += 1
            return
    runs.append(_Run(seq, label, ts))


def _stretches(runs: Iterable[_Run], period: float) -> tuple[Stretch, ...]:
    """Sum runs per function, most time first.

    A run covers ``last - first`` plus one sampling ``period`` (the time the
    last sample stands for), so a single sample counts one period.
    """
    seconds: dict[str, float] = {}
    samples: dict[str, int] = {}
    for run in runs:
        seconds[run.label] = seconds.get(run.label, 0.0) + (run.last - run.first) + period
        samples[run.label] = samples.get(run.label, 0) + run.samples
    return tuple(
        sorted(
            (Stretch(label, seconds[label], samples[label]) for label in seconds),
            key=lambda s: (-s.seconds, s.function),
        )
    )


# ---------------------------------------------------------------------------
# Naming the work on the loop thread
# ---------------------------------------------------------------------------

# Frames are ranked from most to least useful to a reader of the report:
# the harness's own code, then third-party packages, then the standard
# library, then the loop's own machinery (which never explains a stall).
_USER, _THIRD_PARTY, _STDLIB, _LOOP_MACHINERY = range(4)
_MACHINERY_MODULES = ("asyncio", "selectors", __name__)
_LOOP_ENTRIES = frozenset({"_run_once", "run_forever"})
# What a loop thread waiting for I/O runs: BaseSelector.select and its subclasses'.
_SELECT_CODES = frozenset(
    cls.select.__code__
    for cls in vars(selectors).values()
    if isinstance(cls, type)
    and issubclass(cls, selectors.BaseSelector)
    and hasattr(cls.select, "__code__")
)


def _waiting_for_io(frame: types.FrameType | None) -> bool:
    """True when the loop thread's innermost frame is its selector's wait."""
    return frame is not None and frame.f_code in _SELECT_CODES


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib") if key in paths}
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


class _FrameNamer:
    """Name the innermost useful frame of a stack, caching per file and code."""

    def __init__(self) -> None:
        self._stdlib = _stdlib_dirs()
        self._ranks: dict[str, int] = {}
        self._labels: dict[types.CodeType, str] = {}

    def _rank(self, frame: types.FrameType) -> int:
        filename = frame.f_code.co_filename
        rank = self._ranks.get(filename)
        if rank is None:
            rank = self._classify(filename, str(frame.f_globals.get("__name__", "")))
            self._ranks[filename] = rank
        return rank

    def _classify(self, filename: str, module: str) -> int:
        if any(module == m or module.startswith(m + ".") for m in _MACHINERY_MODULES):
            return _LOOP_MACHINERY
        if filename.startswith("<frozen "):
            return _STDLIB
        if filename.startswith("<"):
            # "<string>" (python -c), "<stdin>", exec'd code: the user's.
            return _USER
        real = os.path.realpath(filename)
        parts = real.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            return _THIRD_PARTY
        if real.startswith(self._stdlib):
            return _STDLIB
        return _USER

    def label(self, frame: types.FrameType) -> str | None:
        """Return ``"module:qualname (file:line)"`` for the most useful frame.

        Returns None when the loop is waiting in its selector: it is about to
        run late callbacks, not held by anything.
        """
        if frame.f_code.co_name == "select" and frame.f_globals.get("__name__") == "selectors":
            return None
        best: types.FrameType = frame
        best_rank = _LOOP_MACHINERY + 1
        current: types.FrameType | None = frame
        while current is not None:
            rank = self._rank(current)
            if rank == _LOOP_MACHINERY and current.f_code.co_name in _LOOP_ENTRIES:
                # Frames further out started the loop; they never hold it.
                break
            if rank < best_rank:
                best, best_rank = current, rank
                if rank == _USER:
                    break
            current = current.f_back
        code = best.f_code
        text = self._labels.get(code)
        if text is None:
            module = best.f_globals.get("__name__", "?")
            text = f"{module}:{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"
            self._labels[code] = text
        return text


# ---------------------------------------------------------------------------
# The watchdog
# ---------------------------------------------------------------------------


@dataclass
class _Stall:
    ran_at: float
    lag: float
    runs: list[_Run]


class LoopWatchdog:
    """Watch an asyncio loop for stalls and name the code that caused them.

    Use it around a harness's main coroutine, or with :meth:`start` and
    :meth:`stop`. At most once per ``window`` seconds, when the loop ran at
    least ``threshold`` seconds late, it logs a warning on the
    ``agentscope.watchdog`` logger and calls ``on_report`` with a
    :class:`StallReport`. The callback runs on the watchdog's thread; hand
    the report to the loop with ``loop.call_soon_threadsafe`` if needed. An
    exception from the callback is logged and watching goes on.

    ``interval`` is the heartbeat period: the watchdog's thread posts a
    heartbeat to the loop every ``interval`` seconds, measures how late the
    loop runs it, and starts sampling once one is ``interval`` late; a
    stall's lag is measured to within ``interval``. By default it is a
    quarter of ``threshold``, at most 0.25 s (4 wake-ups a second). ``sample_interval`` is
    the stack sampling period while the loop is late. Stopping reports the
    current, partial window if it had stalls.

    Example::

        async def main() -> None:
            async with LoopWatchdog(threshold=1.0, window=30.0, on_report=print):
                await run_harness()

    Raises:
        ValueError: a period or threshold is not positive.
    """

    def __init__(
        self,
        *,
        threshold: float = 1.0,
        window: float = 30.0,
        on_report: Callable[[StallReport], None] | None = None,
        interval: float | None = None,
        sample_interval: float = 0.002,
    ) -> None:
        if interval is None:
            # Each heartbeat wakes this thread, and a wake-up contends for the
            # GIL with the busy loop: at 25 a second that measured 2-4 % of a
            # chain of tiny callbacks, at 4 a second it is lost in the noise.
            # A quarter of the threshold still catches and samples any stall
            # that reaches it.
            interval = min(DEFAULT_INTERVAL, threshold / 4) if threshold > 0 else DEFAULT_INTERVAL
        for name, value in (
            ("threshold", threshold),
            ("window", window),
            ("interval", interval),
            ("sample_interval", sample_interval),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        self.threshold = threshold
        self.window = window
        self.on_report = on_report
        self.interval = interval
        self.sample_interval = sample_interval
        self._state = "new"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        # (seq, monotonic time) of the last heartbeat the loop ran; written by
        # the loop thread as one tuple so the watcher never sees half of it.
        self._stamped: tuple[int, float] = (0, 0.0)
        self._started = 0.0
        self._wall_offset = 0.0
        self._last_lag: float | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._namer = _FrameNamer()

    @property
    def last_lag(self) -> float | None:
        """The lag of the most recent heartbeat in seconds, None before the first."""
        return self._last_lag

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start watching ``loop`` (default: the running loop).

        ``loop`` may be a loop that is not running yet; watching begins with
        its first iteration.

        Raises:
            AgentscopeError: the watchdog was already started, or no loop was
                given and none is running.
        """
        if self._state != "new":
            raise AgentscopeError(
                f"this LoopWatchdog is {self._state}; create a new LoopWatchdog to watch again"
            )
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None:
            if running is None:
                raise AgentscopeError(
                    "LoopWatchdog.start() needs a running event loop; call it from a "
                    "coroutine or pass loop="
                )
            loop = running
        if loop is running:
            # Known now, so a stall that starts before the first heartbeat
            # runs can be sampled too; otherwise the heartbeat learns it.
            self._loop_thread_id = threading.get_ident()
        self._loop = loop
        self._state = "running"
        self._started = time.monotonic()
        self._wall_offset = time.time() - self._started
        self._thread = threading.Thread(target=self._watch, name="agentscope-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching, and report the current window if it had stalls.

        Waits for the watchdog's thread to finish, which includes that last
        ``on_report`` call. Safe to call more than once.
        """
        if self._state != "running":
            self._state = "stopped"
            return
        self._state = "stopped"
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    # -- loop thread ------------------------------------------------------

    def _stamp(self, seq: int) -> None:
        # The only code the watchdog runs on the loop: two stores, posted by
        # the watcher with call_soon_threadsafe. No timer is ever scheduled,
        # because once any timer is pending asyncio reads the clock and
        # peeks at its heap on every loop iteration (1-2 % of a busy loop).
        self._loop_thread_id = threading.get_ident()
        self._stamped = (seq, time.monotonic())

    # -- watcher thread ---------------------------------------------------

    def _watch(self) -> None:
        assert self._loop is not None
        loop = self._loop
        interval = self.interval
        runs: list[_Run] = []
        stalls: list[_Stall] = []
        window_start = self._started
        window_end = window_start + self.window
        seq = 0
        # When the pending heartbeat was posted, moved up to the last time
        # the loop was seen not running (idle time is not a stall); None
        # while no heartbeat is pending.
        since: float | None = None
        while True:
            if since is not None:
                ran_seq, ran_at = self._stamped
                if ran_seq == seq:
                    lag = max(0.0, ran_at - since)
                    self._last_lag = lag
                    if lag >= self.threshold:
                        if runs:
                            # Sampling starts up to two intervals into a stall;
                            # the lead-in is credited to the first work sampled.
                            runs[0].first = min(runs[0].first, ran_at - lag)
                        stalls.append(_Stall(ran_at, lag, runs))
                    runs = []
                    since = None
            now = time.monotonic()
            if self._stopping.is_set() or loop.is_closed():
                self._flush(window_start, now, stalls)
                return
            while now >= window_end:
                done = [s for s in stalls if s.ran_at < window_end]
                stalls = [s for s in stalls if s.ran_at >= window_end]
                self._flush(window_start, window_end, done)
                window_start, window_end = window_end, window_end + self.window
            if since is None:
                # Healthy: post the next heartbeat and sleep one interval. This
                # is the whole steady-state cost: one short wake-up of this
                # thread per interval and one tiny callback on the loop.
                seq += 1
                # A stall may have begun since the last heartbeat ran: unless
                # the loop is waiting for I/O right now, count from that run,
                # so a lag is never under the stall (and over it by at most
                # one interval).
                frame = sys._current_frames().get(self._loop_thread_id or -1)
                ran_at = self._stamped[1]
                since = now if _waiting_for_io(frame) or not ran_at else max(ran_at, now - interval)
                del frame
                try:
                    loop.call_soon_threadsafe(self._stamp, seq)
                except RuntimeError:
                    # Closed between the check above and the call.
                    self._flush(window_start, now, stalls)
                    return
                self._stopping.wait(min(interval, window_end - now))
                continue
            late = now - since
            if late < interval:
                # Woken early (a window ended): not late yet.
                self._stopping.wait(min(interval - late, window_end - now))
                continue
            if not loop.is_running():
                # Between run_until_complete calls, or not started yet.
                since = now
                self._stopping.wait(interval)
                continue
            frame = sys._current_frames().get(self._loop_thread_id or -1)
            label = None if frame is None else self._namer.label(frame)
            if label is not None:
                _add_sample(runs, seq, label, now)
            del frame  # do not keep the loop thread's frames alive while sleeping
            self._stopping.wait(self.sample_interval)

    def _flush(self, start: float, end: float, stalls: list[_Stall]) -> None:
        if not stalls:
            return
        report = StallReport(
            window_start=start + self._wall_offset,
            window_end=end + self._wall_offset,
            worst_lag=max(s.lag for s in stalls),
            stall_count=len(stalls),
            stretches=_stretches((r for s in stalls for r in s.runs), self.sample_interval),
        )
        logger.warning("%s", report.describe())
        if self.on_report is not None:
            try:
                self.on_report(report)
            except Exception:
                # The callback is the caller's code running on our thread; if
                # it raised out of here the watchdog would die silently and
                # stop watching, which is worse than one lost report.
                logger.exception("LoopWatchdog on_report callback failed")


# ---------------------------------------------------------------------------
# The fatal-reason log
# ---------------------------------------------------------------------------


def _exception_name(exc_type: type[BaseException]) -> str:
    module = exc_type.__module__
    if module in ("builtins", "__main__"):
        return exc_type.__qualname__
    return f"{module}.{exc_type.__qualname__}"


def _exception_message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        # A broken __str__ must not stop the reason being written; this is
        # what traceback does too.
        return f"<exception str() failed for {type(exc).__name__}>"


class FatalLog:
    """The handle :func:`install_fatal_log` returns; uninstalls the hooks.

    Usable as a context manager: leaving the block uninstalls.
    """

    def __init__(self, path: Path, handler: logging.handlers.RotatingFileHandler) -> None:
        self.path = path
        self._handler = handler
        self._installed = True
        self._prev_sys_hook = sys.excepthook
        self._prev_thread_hook = threading.excepthook
        self._loops: list[tuple[asyncio.AbstractEventLoop, Any]] = []
        sys.excepthook = self._sys_hook
        threading.excepthook = self._thread_hook

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.uninstall()

    @property
    def installed(self) -> bool:
        """True until :meth:`uninstall` is called."""
        return self._installed

    def record(self, exc: BaseException, *, where: str, context: str | None = None) -> None:
        """Write one fatal record for ``exc`` now.

        The hooks call this; a harness that catches a fatal error itself (and
        exits on its own terms) can call it too. ``where`` says where the
        error happened, for example ``"main thread"``.
        """
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")
        lines = [
            f"=== {stamp} pid={os.getpid()} where={where}: "
            f"{_exception_name(type(exc))}: {_exception_message(exc)}"
        ]
        if context:
            lines.append(f"context: {context}")
        lines.append("".join(traceback.format_exception(exc)).rstrip("\n"))
        record = logging.LogRecord(
            name="agentscope.fatal",
            level=logging.CRITICAL,
            pathname=__file__,
            lineno=0,
            msg="%s",
            args=("\n".join(lines),),
            exc_info=None,
        )
        # The handler flushes after every record, so the reason is on disk
        # before the interpreter starts to shut down.
        self._handler.handle(record)

    def watch_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Also record exceptions that reach ``loop``'s exception handler.

        The previous handler (or the loop's default) still runs afterwards.
        """
        previous = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if self._installed and isinstance(exc, BaseException):
                self.record(exc, where="event loop", context=str(context.get("message", "")))
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
        self._loops.append((loop, handler))

    def uninstall(self) -> None:
        """Restore the previous hooks and close the file. Safe to call twice.

        A hook that someone else has since replaced is left in place; ours,
        still in their chain, then only passes through.
        """
        if not self._installed:
            return
        self._installed = False
        if sys.excepthook == self._sys_hook:
            sys.excepthook = self._prev_sys_hook
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._prev_thread_hook
        for loop, handler in self._loops:
            if not loop.is_closed() and loop.get_exception_handler() is handler:
                loop.set_exception_handler(None)
        self._loops.clear()
        self._handler.close()

    def _sys_hook(
        self,
        exc_type: type[BaseException],
        exc: BaseException,
        tb: types.TracebackType | None,
    ) -> None:
        if self._installed:
            self.record(exc, where="main thread")
        self._prev_sys_hook(exc_type, exc, tb)

    def _thread_hook(self, args: threading.ExceptHookArgs) -> None:
        # SystemExit ends a thread quietly; threading's own hook ignores it too.
        if self._installed and args.exc_value is not None and args.exc_type is not SystemExit:
            name = args.thread.name if args.thread is not None else "<unknown>"
            self.record(args.exc_value, where=f"thread {name}")
        self._prev_thread_hook(args)


def install_fatal_log(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = 1_000_000,
    backups: int = 3,
    loop: asyncio.AbstractEventLoop | None = None,
) -> FatalLog:
    """Write the reason and traceback of an uncaught exception to ``path``.

    Installs :data:`sys.excepthook` and :data:`threading.excepthook` (both
    chain to the hooks they replace, so tracebacks still reach stderr) and,
    when ``loop`` is given, that loop's exception handler. Each record holds
    a timestamp, the pid, where it happened (``main thread``,
    ``thread NAME``, ``event loop``), the exception's type and message and
    its full traceback. The file rotates at ``max_bytes`` and keeps
    ``backups`` old files (``path.1`` ...); a single record larger than
    ``max_bytes`` is still written whole.

    Example::

        fatal = install_fatal_log("/var/log/harness/fatal.log", loop=loop)
        ...
        fatal.uninstall()

    Raises:
        ValueError: ``max_bytes`` or ``backups`` is not positive.
        OSError: the file cannot be opened for appending (checked now, not
            when the process is dying).
    """
    if max_bytes <= 0 or backups <= 0:
        raise ValueError(f"max_bytes and backups must be > 0, got {max_bytes!r}, {backups!r}")
    target = Path(path)
    handler = logging.handlers.RotatingFileHandler(
        target, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    fatal = FatalLog(target, handler)
    if loop is not None:
        fatal.watch_loop(loop)
    return fatal
