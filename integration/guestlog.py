"""What a test VM's serial ports said: the payload's stream, and why a suite has no result.

The runner (vm.py) boots a guest whose payload prints pytest's verbose
output and one status line on the second serial port; the first is the
guest's console. :func:`follow` reads the stream as it comes; :class:`Stream`
is what it learnt (summaries, failures, which test was running), so that a
guest that died mid-suite can be booted once more for what it had not run
(:func:`resumed`) and the matrix's table, often the only part of CI's log a
reader sees, says why and where (:func:`no_result`).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

STATUS = re.compile(r"@@AGENTSCOPE-STATUS(.*)@@")
SUMMARY = re.compile(r"^=+ (.*\b(?:passed|failed|error|errors|skipped|deselected)\b.*) in [\d.]+s")
# pytest -ra's short summary: kept so the matrix table at the end (all a CI log's
# tail may show) names what failed, not only how many.
FAILED = re.compile(r"^(?:FAILED|ERROR) \S+")
# A test's verbose line, "tests/f.py::name[param id] PASSED [ 40%]". pytest
# writes the id when the test starts and the outcome when it ends: an id on a
# line not yet ended is the test that was running.
OUTCOME = re.compile(r"^(tests/\S.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
HEADER = re.compile(r"^==== \S+ \(systemd \S+\) (\w+) manager")
# What a guest console says when the guest itself failed.
CONSOLE_DEATH = re.compile(
    r"Kernel panic[^\n]*|BUG: [^\n]*|Oops[^\n]*|general protection fault[^\n]*"
    r"|invalid opcode[^\n]*"
    r"|Out of memory: Killed process \d+ \([^)]*\)"
)
# How many characters of a test's id the matrix line quotes.
_ID = 200


class Stream:
    """What the payload's serial said: see :func:`follow`."""

    def __init__(self) -> None:
        self.status: str | None = None
        self.summaries: dict[str, str] = {}
        self.failures: dict[str, list[str]] = {}
        self.seen = False  # any line came
        self.ended = False  # the VM ended by itself
        self.timed_out = False
        self.why_stuck: str | None = None  # see vm._stuck
        # The manager whose suite was running, the suites that started, and
        # each suite's tests with their outcomes (a test can have two lines:
        # PASSED, then ERROR at teardown).
        self.current: str | None = None
        self.started: list[str] = []
        self.ran: dict[str, dict[str, str]] = {}
        self.running: str | None = None  # the test whose line had not ended

    @property
    def last_test(self) -> str | None:
        """The test that was running when the stream stopped, or the last that ended."""
        done = self.ran.get(self.current or "", {})
        return self.running or (next(reversed(done)) if done else None)

    def line(self, line: str) -> None:
        """Take in one whole line of the payload's output."""
        self.seen = True
        if m := HEADER.match(line):
            self.current, self.running = m.group(1), None
            self.started.append(self.current)
        elif (m := SUMMARY.match(line)) and self.current:
            self.summaries[self.current] = m.group(1)
        elif FAILED.match(line) and self.current:
            self.failures.setdefault(self.current, []).append(line[:400])
        elif m := STATUS.search(line):
            self.status = m.group(1)
        elif (m := OUTCOME.match(line)) and self.current:
            done = self.ran.setdefault(self.current, {})
            if done.get(m.group(1)) not in ("FAILED", "ERROR"):
                done[m.group(1)] = m.group(2)
            self.running = None

    def pending(self, managers: list[str]) -> list[str]:
        """The suites that gave no summary."""
        return [m for m in managers if m not in self.summaries]


def follow(
    proc: subprocess.Popen[bytes],
    out: Path,
    deadline: float,
    prefix: str,
    stuck: Callable[[], str | None],
    stopping: threading.Event,
) -> Stream:
    """Stream the payload's serial until the VM ends, is stuck, or ``deadline`` (monotonic)."""
    st = Stream()
    next_check = 0.0
    with out.open("rb") as f:
        buf = b""
        while True:
            chunk = f.read()
            if chunk:
                buf += chunk.replace(b"\r", b"")
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    line = raw.decode(errors="replace")
                    print(prefix + line, flush=True)
                    st.line(line)
                if buf.startswith(b"tests/"):
                    st.running = buf.decode(errors="replace").strip()[:_ID]
            elif proc.poll() is not None:
                st.ended = True
                break
            else:
                time.sleep(0.2)
            # Until the guest has said something: is it slow, or stuck for good?
            if not st.seen and time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                if why := stuck():
                    st.why_stuck = why
                    break
            if time.monotonic() > deadline:
                st.timed_out = True
                break
            if stopping.is_set():
                break
    return st


def panicked(console: str) -> str | None:
    """The guest kernel's panic line, if it panicked."""
    m = re.search(r"Kernel panic[^\n]*", console)
    return m.group(0).strip()[:160] if m else None


def no_result(st: Stream, manager: str, elapsed: float, console: str) -> str:
    """One line for the matrix: why a suite has no result, and where it was."""
    if st.timed_out:
        how = f"the runner's timeout after {elapsed:.0f}s"
    elif st.why_stuck:
        how = st.why_stuck
    elif st.ended:
        how = f"the VM ended after {elapsed:.0f}s without the payload's status"
    else:
        how = f"stopped after {elapsed:.0f}s"
    if manager not in st.started:
        where = "; its suite never started"
    elif st.current == manager:
        last = st.last_test
        where = f"; last test: {last[:_ID]}" if last else "; before its first test"
    else:
        where = "; its suite printed no summary"
    died = CONSOLE_DEATH.findall(console)
    said = f"; guest console: {died[-1][:160]}" if died else ""
    return f"no result: {how}{where}{said}"


def resumed(first: Stream, second: Stream, manager: str, why: str) -> tuple[str, list[str], bool]:
    """A suite cut short in ``first`` and finished in ``second``: its summary,
    FAILED lines, and whether the first part failed.

    The tests that ended in the first boot were not run again (vm.py's
    deselect file); their outcomes are counted here, and the summary says so,
    so the matrix's totals add both parts.
    """
    summary = second.summaries[manager]
    failures = list(second.failures.get(manager, []))
    before = first.ran.get(manager, {})
    if not before:
        return f"{summary} (booted again: {why})", failures, False
    counts = Counter(before.values())
    words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
    part = ", ".join(f"{n} {words.get(k, k.lower())}" for k, n in sorted(counts.items()))
    bad = [t for t, o in before.items() if o in ("FAILED", "ERROR")]
    failures += [f"{before[t]} {t} (before the reboot)"[:400] for t in bad]
    return f"{summary}; before {why}: {part}", failures, bool(bad)
