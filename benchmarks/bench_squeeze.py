"""The squeeze of issue #20: a runaway tool call with no cap, three ways, in one run.

Needs a systemd host with cgroup v2 and memory to lose (run it in the test
bed's 768 MB VM, Debian's kernel defaults: no MGLRU ``min_ttl_ms``). Each
round launches a fresh fleet:

- one agent whose tool call (a ``python3`` the agent's ``sh`` starts) grows
  16 MiB every 20 ms, touching its pages, with no per-agent cap;
- 6 sibling agents appending a timestamp to a file every 0.2 s;
- the manager: this process, holding the fleet, its monitor (1 s samples,
  no pressure reports: a host-wide /proc pass in mid-squeeze measures
  itself) and a 50 ms asyncio ticker that keeps its worst loop lag.

The rounds (``--rounds``):

``kernel``
    nothing but the kernel: the runaway lives until the global OOM killer
    takes it, or until ``--give-up`` seconds (then the benchmark kills it
    and says so);
``earlyoom``
    Debian's earlyoom package at its defaults (its own unit, masked in the
    images, unmasked for this round only through integration/roothelper.py);
``guard``
    agentscope's guard: ``fleet.monitor(guard=True)``, default GuardConfig,
    the guard a thread of the manager's process;
``guardproc``
    the same guard as a process of its own (``GuardConfig(process=True)``):
    whether the thread suffices or the guard needs its own process;
``guardfar``
    the guard without choosing its victim ahead (``_guard.NEAR_FACTOR`` set
    to 0 for the round, a benchmark-only switch): whether the scans within
    1.5x of the threshold cost the siblings what the timeline shows;
``earlyoom-big``, ``guard-big``
    the same with the manager holding ``--ballast-mb`` (default 320 MiB)
    so that it is the host's largest process;
``oomd``
    systemd-oomd alone, where ``--profile`` has it (ubuntu, fedora).

``--profile ubuntu|fedora`` first makes the VM that host (integration/
roothelper.sh ``profile``: a swap file or zram as large as memory, and
systemd-oomd with that distribution's drop-ins), and the runaway's pages
then do not compress. systemd-oomd is stopped for the ``kernel`` and
``earlyoom`` rounds and runs in the others, as on that host: the guard's
rounds count what oomd killed (its journal) as well.

``--compact``: the kernel compacts its memory before each round, so that a
round after another's squeeze starts with free memory in one piece (the
misses of docs/benchmarks.md, "Which rounds miss", came after one).

Per round: the runaway's lifetime (its first allocation until its shell saw
it die), the manager's worst loop lag, the siblings' longest heartbeat gap,
what was killed (the tool call's exit status, the kernel's ``oom_kill``
count in /proc/vmstat, earlyoom's log, every agent's and the manager's
survival), whether anything recorded which agent lost what, the guard's
own reaction time (threshold crossing to signal, from its GuardKill), and
"crossing to death": when a 20 ms sampler thread here first saw
MemAvailable <= 10% until the runaway died. Then the guard's idle CPU at
``--idle-agents`` (default 50) agents: whole-process CPU with the monitor
alone and with the guard, interleaved.

Run: ``python3 benchmarks/bench_squeeze.py [--rounds kernel,earlyoom,guard]``
(in the VM: ``make bench BENCH=bench_squeeze.py DISTRO=trixie MANAGER=both``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import agentscope_systemd
from agentscope_systemd import DEVNULL, AsyncFleet, OomKill
from agentscope_systemd._guard import _guard as _guard_module  # guardfar's switch

_HERE = Path(__file__).resolve().parent
# roothelper.py: next to the benchmarks in the VM (/tmp/it), in integration/ in a checkout.
for _where in (_HERE.parent, _HERE.parent / "integration"):
    if (_where / "roothelper.py").is_file():
        sys.path.insert(0, str(_where))
        break
from roothelper import RootHelperError, as_root  # noqa: E402

SIBLINGS = 6
TICK = 0.05
#: The tool call: stamps its start (time, pid), then 16 MiB every 20 ms, each touched.
GROW = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'w').write(f'{time.time()} {os.getpid()}')\n"
    "chunks = []\n"
    "while True:\n"
    "    chunks.append(b'x' * (16 << 20))\n"
    "    time.sleep(0.02)\n"
)
# The agent: waits for the trigger, runs the tool call, writes its exit
# status and the time it saw it end, and lives on (as an agent survives a tool call).
RUNAWAY = (
    'while [ ! -e "$1" ]; do sleep 0.1; done\n'
    'python3 -c "$2" "$3"\n'
    'echo "$? $(date +%s.%N)" > "$4"\n'
    "while :; do sleep 3600; done\n"
)
HEARTBEAT = 'while :; do date +%s.%N >> "$1"; sleep 0.2; done'
#: The same tool call on a host with swap: each page distinct random bytes, which
#: zram cannot compress (the zram wedge of issue #25).
GROW_INCOMPRESSIBLE = GROW.replace(
    "chunks = []\n", "block = os.urandom(1 << 20)\nchunks = []\n"
).replace("b'x' * (16 << 20)", "bytearray(block * 16)")


@dataclass
class Outcome:
    """One round's figures (seconds unless named otherwise)."""

    round: str
    manager: str
    runaway_lifetime: float | None = None
    given_up: bool = False
    exit_status: int | None = None  # the tool call's, as its shell saw it
    manager_worst_lag: float = 0.0
    sibling_worst_gap: float = 0.0
    # The same before MemAvailable reached 10 %: the noise floor of the gap
    # under TCG (a sibling's `date` and `sleep` are execs of ~30 ms there, and
    # the runaway holds a vCPU), not the squeeze's.
    sibling_gap_before_crossing: float | None = None
    kernel_oom_kills: int = 0
    earlyoom_kills: list[str] = field(default_factory=list)
    oomd_kills: list[str] = field(default_factory=list)
    oom_events: list[dict[str, Any]] = field(default_factory=list)
    guard_kills: list[dict[str, Any]] = field(default_factory=list)
    guard_reaction: float | None = None
    crossing_to_death: float | None = None
    siblings_alive: int = 0
    runaway_shell_alive: bool = False
    manager_rss_mb: float = 0.0
    named_agent: str | None = None


class Ticker:
    """A 50 ms asyncio ticker: the worst lateness of the manager's loop while armed."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.lags: list[tuple[float, float]] = []  # (wall time it ended, lateness) over 0.25 s
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + TICK
            await asyncio.sleep(TICK)
            late = time.monotonic() - due
            self.worst = max(self.worst, late)
            if late > 0.25:
                self.lags.append((time.time(), late))

    def start(self) -> None:
        self.worst = 0.0
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.worst


def meminfo() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    return out


def vmstat_oom_kills() -> int:
    with open("/proc/vmstat") as f:
        for line in f:
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return 0


class Crossing(threading.Thread):
    """Notes when MemAvailable first falls to 10% of MemTotal (20 ms samples).

    Every 5th sample also goes to ``samples`` for ``--timeline``: (time,
    MemAvailable %, SwapFree %, PSI some and full totals in microseconds,
    pages swapped out, pages swapped in or refaulted, zram0's stored and
    RAM-used bytes).
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.at: float | None = None
        self.stop = threading.Event()
        self.samples: list[tuple[float, float, float, int, int, int, int, int, int]] = []

    def run(self) -> None:
        n = 0
        while not self.stop.wait(0.02):
            m = meminfo()
            if self.at is None and m["MemAvailable"] <= m["MemTotal"] // 10:
                self.at = time.time()
            n += 1
            if n % 5 == 0:
                self.samples.append(_sample(m))


def _sample(m: dict[str, int]) -> tuple[float, float, float, int, int, int, int, int, int]:
    some = full = 0
    with open("/proc/pressure/memory") as f:
        for line in f:
            total = int(line.rsplit("total=", 1)[1])
            if line.startswith("some"):
                some = total
            else:
                full = total
    vm = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, _, v = line.partition(" ")
            vm[k] = int(v)
    swap = 100.0 * m["SwapFree"] / m["SwapTotal"] if m.get("SwapTotal") else 0.0
    stored = used = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mm = Path("/sys/block/zram0/mm_stat").read_text().split()
        stored, used = int(mm[0]), int(mm[2])
    return (
        time.time(),
        100.0 * m["MemAvailable"] / m["MemTotal"],
        swap,
        some,
        full,
        vm.get("pswpout", 0),
        vm.get("pswpin", 0)
        + vm.get("workingset_refault_anon", 0)
        + vm.get("workingset_refault_file", 0),
        stored,
        used,
    )


def thread_cpu() -> dict[tuple[int, str], float]:
    """This process's threads' CPU seconds (user + system), by (tid, name): two reads, no sampling.

    With ``--timeline``, read at the trigger and at the end: what the
    manager's own threads (the event loop, the monitor's sampler, the
    guard) took of the guest's CPUs while siblings fell silent.
    """
    out: dict[tuple[int, str], float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    # Python names its threads only for itself (the kernel's comm is the
    # process's until 3.14): the names come from threading, by native id.
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/self/task/{tid}/stat") as f:
                raw = f.read()
            name = names.get(int(tid)) or raw[raw.index("(") + 1 : raw.rindex(")")]
            rest = raw[raw.rindex(")") + 2 :].split()
            out[int(tid), name] = (int(rest[11]) + int(rest[12])) / tick
    return out


# The kernel's threads that reclaim, compact and collapse huge pages, and
# the counters of that work (/proc/vmstat): a stall with PSI at zero and no
# swap traffic is work that is not charged to a waiting task.
_KERNEL_THREADS = ("kswapd0", "kcompactd0", "khugepaged")
_VMSTAT_WORK = (
    "compact_stall",
    "compact_migrate_scanned",
    "compact_free_scanned",
    "compact_success",
    "pgmigrate_success",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "thp_collapse_alloc",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "allocstall_normal",
    "allocstall_movable",
)


def kernel_work() -> dict[str, float]:
    """The kernel threads' CPU seconds (by name) and /proc/vmstat's work counters."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as f:
                raw = f.read()
            name = raw[raw.index("(") + 1 : raw.rindex(")")]
            if name in _KERNEL_THREADS:
                rest = raw[raw.rindex(")") + 2 :].split()
                out[f"{name}_cpu_s"] = (int(rest[11]) + int(rest[12])) / tick
    with contextlib.suppress(OSError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in _VMSTAT_WORK:
                out[key] = float(value)
    return out


def timeline(
    crossing: Crossing, ticker: Ticker, beats: list[Path], since: float, until: float
) -> list[str]:
    """Half-second rows from the trigger to the end: what the host did, who stalled."""
    stamps = []
    for b in beats:
        with contextlib.suppress(OSError, ValueError):
            stamps.append([float(x) for x in b.read_text().split() if x.strip()])
    rows = [
        "t | avail% | swapfree% | some% | full% | swapout MB/s | in+refault MB/s"
        " | zram MiB stored/used (cost, marginal) | lag | gaps"
    ]
    s = [x for x in crossing.samples if since - 0.5 <= x[0] <= until]
    page = os.sysconf("SC_PAGE_SIZE") / 2**20
    i = 0
    for j in range(1, len(s)):
        if s[j][0] - s[i][0] < 0.5 and j < len(s) - 1:
            continue
        a, b = s[i], s[j]
        span = b[0] - a[0]
        lag = max((late for t, late in ticker.lags if a[0] < t <= b[0]), default=0.0)
        gaps = 0
        for st in stamps:
            before = [t for t in st if t <= b[0]]
            if before and b[0] - before[-1] > 1.0:
                gaps += 1
        rows.append(
            f"{b[0] - since:6.1f} | {b[1]:5.1f} | {b[2]:5.1f} | "
            f"{(b[3] - a[3]) / span / 1e4:5.1f} | {(b[4] - a[4]) / span / 1e4:5.1f} | "
            f"{(b[5] - a[5]) * page / span:6.1f} | {(b[6] - a[6]) * page / span:6.1f} | "
            f"{b[7] >> 20}/{b[8] >> 20} ({b[8] / b[7] if b[7] else 0:.2f}, "
            f"{(b[8] - a[8]) / (b[7] - a[7]) if b[7] - a[7] > 1 << 20 else 0:.2f}) | "
            f"{lag:4.2f} | {gaps}"
        )
        i = j
    return rows


def worst_gap(path: Path, since: float, until: float) -> float:
    """The longest interval between heartbeats (and the window's edges) in [since, until]."""
    try:
        stamps = [float(x) for x in path.read_text().split() if x.strip()]
    except (OSError, ValueError):
        return until - since
    inside = [since, *(t for t in stamps if since < t < until), until]
    return max(b - a for a, b in itertools.pairwise(inside))


async def wait_for(check: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(step)
    return False


def recovered() -> bool:
    m = meminfo()
    return m["MemAvailable"] > m["MemTotal"] // 2


async def squeeze(
    name: str,
    manager: str,
    give_up: float,
    ballast_mb: int,
    profile: str = "debian",
    show_timeline: bool = False,
) -> Outcome:
    """One round; returns its figures. The fleet's agents are stopped afterwards."""
    way = name.removesuffix("-big")
    big = name.endswith("-big")
    out = Outcome(round=name, manager=manager)
    work = Path(tempfile.mkdtemp(prefix=f"squeeze-{name}-"))
    os.chmod(work, 0o755)
    trigger, start_file, end_file = work / "go", work / "start", work / "end"
    ballast = b"\1" * (ballast_mb << 20) if big else b""  # bytes * n: touched now
    out.manager_rss_mb = _own_rss() / 2**20
    fleet = AsyncFleet(f"sq-{name}", manager)
    await fleet.open()
    names: list[str] = []
    events: list[Any] = []
    earlyoom_since = int(time.time())
    oomd = profile != "debian"
    near_factor = _guard_module.NEAR_FACTOR
    try:
        if way == "earlyoom":
            as_root("earlyoom", "start")
        if oomd and way in ("kernel", "earlyoom"):
            as_root("oomd", "stop")  # that round is the kernel's or earlyoom's alone
        beats = [work / f"beat-{i}" for i in range(SIBLINGS)]
        for i, beat in enumerate(beats):
            await fleet.launch(
                f"sib-{i}",
                ["sh", "-c", HEARTBEAT, "sh", str(beat)],
                stdin=DEVNULL,
                stdout=DEVNULL,
                stderr=DEVNULL,
            )
            names.append(f"sib-{i}")
        runaway = await fleet.launch(
            "runaway",
            [
                *("sh", "-c", RUNAWAY, "sh", str(trigger)),
                *(GROW_INCOMPRESSIBLE if oomd else GROW, str(start_file), str(end_file)),
            ],
            stdin=DEVNULL,
            stdout=DEVNULL,
            stderr=DEVNULL,
        )
        names.append("runaway")
        siblings = [a for a in await fleet.agents() if a.name.startswith("sib-")]
        options: dict[str, Any] = {"pressure_some_avg10": 100.0, "available_fraction": 1e-9}
        if way in ("guard", "guardfar"):
            options["guard"] = True
        if way == "guardfar":
            _guard_module.NEAR_FACTOR = 0.0  # restored below, whatever the round's end
        elif way == "guardproc":
            options["guard"] = agentscope_systemd.GuardConfig(process=True)
        ticker = Ticker()
        crossing = Crossing()
        kills_before = vmstat_oom_kills()
        async with fleet.monitor(interval=1.0, **options) as monitor:

            async def collect() -> None:
                async for event in monitor:
                    events.append(event)

            collector = asyncio.create_task(collect())
            await asyncio.sleep(2.0)  # the monitor's first samples, heartbeats running
            ticker.start()
            crossing.start()
            cpu_before = thread_cpu() if show_timeline else {}
            kernel_before = kernel_work() if show_timeline else {}
            t_trigger = time.time()
            await asyncio.to_thread(trigger.touch)
            # give_up counts from the first allocation; the tool call's start-up comes first.
            ended = await wait_for(lambda: _ended(end_file), give_up + 30, step=0.05)
            started = _stamp(start_file)
            if not ended:
                out.given_up = True
                if started is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(started[1], signal.SIGKILL)
                await wait_for(lambda: _ended(end_file), 60)
            await asyncio.sleep(3.0)  # the kill's aftermath: late heartbeats, late events
            t_end = time.time()
            out.manager_worst_lag = await ticker.stop()
            crossing.stop.set()
            cpu_after = thread_cpu() if show_timeline else {}
            kernel_after = kernel_work() if show_timeline else {}
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
        out.kernel_oom_kills = vmstat_oom_kills() - kills_before
        end = end_file.read_text().split() if _ended(end_file) else []
        if end:
            out.exit_status = int(end[0])
            if started is not None:
                out.runaway_lifetime = float(end[1]) - started[0]
                if out.runaway_lifetime > give_up and not out.given_up:
                    out.given_up = True
            if crossing.at is not None:
                out.crossing_to_death = float(end[1]) - crossing.at
        out.sibling_worst_gap = max(worst_gap(b, t_trigger, t_end) for b in beats)
        if crossing.at is not None:
            out.sibling_gap_before_crossing = max(
                worst_gap(b, t_trigger, crossing.at) for b in beats
            )
        if show_timeline:
            print(
                f"timeline of round {name} (crossing at "
                f"{'-' if crossing.at is None else f'{crossing.at - t_trigger:.1f}'} s, runaway "
                f"ended at {f'{float(end[1]) - t_trigger:.1f}' if end else '-'} s):"
            )
            print("\n".join(timeline(crossing, ticker, beats, t_trigger, t_end)), flush=True)
            used = sorted(
                ((cpu_after[k] - cpu_before.get(k, 0.0), k[1]) for k in cpu_after),
                reverse=True,
            )
            print(
                f"the manager's threads' CPU over the round's {t_end - t_trigger:.1f} s: "
                + ", ".join(f"{name} {sec:.1f}s" for sec, name in used if sec >= 0.05),
                flush=True,
            )
            print(
                "the kernel's own work over the round: "
                + ", ".join(
                    f"{k} {kernel_after[k] - kernel_before.get(k, 0.0):g}"
                    for k in sorted(kernel_after)
                    if kernel_after[k] != kernel_before.get(k, 0.0)
                ),
                flush=True,
            )
        out.siblings_alive = sum(1 for s in siblings if s.alive())
        out.runaway_shell_alive = runaway.alive()
        for event in events:
            if isinstance(event, OomKill):
                out.oom_events.append(_small(event.to_dict()))
            elif getattr(event, "kind", None) == "guard_kill":
                out.guard_kills.append(_small(event.to_dict()))
        if out.guard_kills:
            out.guard_reaction = out.guard_kills[0].get("reaction_seconds")
            out.named_agent = out.guard_kills[0].get("agent")
        elif out.oom_events:
            out.named_agent = out.oom_events[0].get("agent")
    finally:
        _guard_module.NEAR_FACTOR = near_factor
        if oomd:
            with contextlib.suppress(RootHelperError):
                log = as_root("oomd", "log", str(earlyoom_since))
                out.oomd_kills = [
                    line.split(": ", 1)[-1][:200] for line in log.splitlines() if "Killed " in line
                ]
            with contextlib.suppress(RootHelperError):
                as_root("oomd", "start")
        if way == "earlyoom":
            with contextlib.suppress(RootHelperError):
                log = as_root("earlyoom", "log", str(earlyoom_since))
                out.earlyoom_kills = [
                    line.split(": ", 1)[-1][:160]
                    for line in log.splitlines()
                    if " to process " in line or "escalating" in line
                ]
            with contextlib.suppress(RootHelperError):
                as_root("earlyoom", "stop")
        await asyncio.gather(*(_stop(fleet, n) for n in names))
        await fleet.aclose()
        del ballast
        shutil.rmtree(work, ignore_errors=True)
        await wait_for(recovered, 60, step=0.5)
    return out


async def _stop(fleet: AsyncFleet, name: str) -> None:
    with contextlib.suppress(agentscope_systemd.AgentscopeError):
        await fleet.stop(name, timeout=5)


def _ended(path: Path) -> bool:
    try:
        return len(path.read_text().split()) == 2
    except OSError:
        return False


def _stamp(path: Path) -> tuple[float, int] | None:
    try:
        t, pid = path.read_text().split()
        return float(t), int(pid)
    except (OSError, ValueError):
        return None


def _own_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _small(d: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "agent",
        "pid",
        "comm",
        "rss",
        "swap",
        "source",
        "trigger",
        "reaction_seconds",
        "mem_available_percent",
        "released",
        "rss_last_seen",
    )
    return {k: d[k] for k in keep if k in d}


async def idle_cost(manager: str, agents: int, seconds: float, pairs: int) -> dict[str, Any]:
    """Whole-process CPU a second at ``agents`` idle agents: the monitor alone, with the guard."""
    fleet = AsyncFleet("sq-idle", manager)
    await fleet.open()
    names = [f"idle-{i}" for i in range(agents)]
    cpu: dict[str, list[float]] = {"monitor": [], "guard": [], "guard_thread": []}
    try:
        for n in names:
            await fleet.launch(n, ["sleep", "3600"], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
        for _ in range(pairs):
            for way in ("monitor", "guard"):
                options: dict[str, Any] = {"guard": True} if way == "guard" else {}
                async with fleet.monitor(interval=2.0, **options):
                    await asyncio.sleep(3.0)  # settle: first samples, watches set
                    g0 = _guard_thread_cpu()
                    c0, t0 = time.process_time(), time.monotonic()
                    await asyncio.sleep(seconds)
                    wall = time.monotonic() - t0
                    cpu[way].append((time.process_time() - c0) / wall)
                    g1 = _guard_thread_cpu()
                    if way == "guard" and g0 is not None and g1 is not None:
                        cpu["guard_thread"].append((g1 - g0) / wall)
    finally:
        await asyncio.gather(*(_stop(fleet, n) for n in names))
        await fleet.aclose()
    monitor = statistics.median(cpu["monitor"])
    guard = statistics.median(cpu["guard"])
    thread = statistics.median(cpu["guard_thread"]) if cpu["guard_thread"] else None
    return {
        "agents": agents,
        "monitor_cpu_percent": round(monitor * 100, 3),
        "guard_cpu_percent": round(guard * 100, 3),
        "guard_cost_percent_of_a_core": round((guard - monitor) * 100, 3),
        "guard_thread_percent_of_a_core": None if thread is None else round(thread * 100, 3),
        "samples": {k: [round(v * 100, 3) for v in vs] for k, vs in cpu.items()},
    }


def _guard_thread_cpu() -> float | None:
    """CPU seconds of the guard's thread so far (its /proc task stat), None if not running."""
    for t in threading.enumerate():
        if t.name == "agentscope-guard" and t.native_id is not None:
            try:
                fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text()
            except OSError:
                return None
            utime, stime = fields.rsplit(")", 1)[1].split()[11:13]
            return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
    return None


def _fmt(v: float | None, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.2f}{unit}" if unit == "s" else f"{v:.0f}{unit}"


def table(rows: list[Outcome]) -> str:
    head = (
        "round",
        "lifetime",
        "lag",
        "gap",
        "gap before crossing",
        "killed",
        "kernel oom",
        "named",
        "reaction",
        "cross->death",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for o in rows:
        life = _fmt(o.runaway_lifetime) + (" (gave up)" if o.given_up else "")
        killed = f"tool call exit {o.exit_status}" if o.exit_status is not None else "?"
        if o.earlyoom_kills:
            killed += f"; earlyoom: {len(o.earlyoom_kills)} signals"
        if o.oomd_kills:
            killed += f"; oomd: {len(o.oomd_kills)} kills"
        if o.siblings_alive != SIBLINGS or not o.runaway_shell_alive:
            killed += f"; siblings alive {o.siblings_alive}/{SIBLINGS}"
            killed += f", shell alive {o.runaway_shell_alive}"
        lines.append(
            " | ".join(
                (
                    o.round,
                    life,
                    _fmt(o.manager_worst_lag),
                    _fmt(o.sibling_worst_gap),
                    _fmt(o.sibling_gap_before_crossing),
                    killed,
                    str(o.kernel_oom_kills),
                    o.named_agent or "nobody",
                    _fmt(o.guard_reaction),
                    _fmt(o.crossing_to_death),
                )
            )
        )
    return "\n".join(lines)


def ratios(rows: list[Outcome]) -> list[str]:
    by = {o.round: o for o in rows}
    out = []
    for a, b in (
        ("guard", "earlyoom"),
        ("guard", "oomd"),
        ("guardproc", "earlyoom"),
        ("guardproc", "guard"),
        ("guardfar", "guard"),
        ("guardproc-big", "earlyoom-big"),
        ("guard", "kernel"),
        ("earlyoom", "kernel"),
        ("guard-big", "earlyoom-big"),
    ):
        if a in by and b in by:
            for what in ("runaway_lifetime", "manager_worst_lag", "sibling_worst_gap"):
                x, y = getattr(by[a], what), getattr(by[b], what)
                if x is not None and y:
                    out.append(f"{a}/{b} {what}: {x / y:.3f}x ({x:.2f} / {y:.2f})")
    return out


async def main_async(args: argparse.Namespace) -> None:
    manager = os.environ.get("AGENTSCOPE_TEST_MANAGER", args.manager)
    has_guard = hasattr(agentscope_systemd, "GuardKill")
    print(
        f"bench_squeeze: {manager} manager, MemTotal {meminfo()['MemTotal'] >> 20} MiB, "
        f"min_ttl_ms {_read('/sys/kernel/mm/lru_gen/min_ttl_ms')}, "
        f"dmesg_restrict {_read('/proc/sys/kernel/dmesg_restrict')}, guard "
        f"{'available' if has_guard else 'NOT in this build'}",
        flush=True,
    )
    rows = []
    if args.profile != "debian":
        print(as_root("profile", args.profile, timeout=120), flush=True)
    try:
        for name in [r for r in args.rounds.split(",") if r]:
            if name.startswith("guard") and not has_guard:
                print(f"round {name}: skipped (no guard in this build)", flush=True)
                continue
            if name == "oomd" and args.profile == "debian":
                print("round oomd: skipped (the debian profile has no systemd-oomd)", flush=True)
                continue
            if args.profile != "debian":
                # Each round starts as the first did: the last round's squeeze
                # left pages in swap, which made the next round's MemAvailable
                # cross later (ubuntu, 2026-12-03: 11 s and 27 s to the crossing).
                print(as_root("swap", "empty", timeout=180), flush=True)
            if args.compact:
                # The rounds that missed the targets came after another squeeze
                # in the same boot, with kcompactd migrating 21,348 pages inside
                # the round (docs/benchmarks.md, "Which rounds miss"): whether
                # a round that starts with its free memory in one piece meets them.
                print(as_root("memory", "compact", timeout=180), flush=True)
            t0 = time.monotonic()
            o = await squeeze(
                name, manager, args.give_up, args.ballast_mb, args.profile, args.timeline
            )
            rows.append(o)
            took = time.monotonic() - t0
            print(f"round {name} ({took:.0f}s): {json.dumps(asdict(o))}", flush=True)
    finally:
        if args.profile != "debian":
            print(as_root("profile", "debian", timeout=180), flush=True)
    print(
        f"\nsqueeze, {manager} manager, {args.profile} host (lifetime: first allocation until"
        " its shell saw it die;"
        " lag: manager's worst 50 ms tick lateness; gap: siblings' longest heartbeat gap)"
    )
    print(table(rows))
    for line in ratios(rows):
        print(line)
    if has_guard and args.idle_agents:
        idle = await idle_cost(manager, args.idle_agents, args.idle_seconds, args.idle_pairs)
        print(f"idle cost: {json.dumps(idle)}", flush=True)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "absent"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--rounds", default="kernel,earlyoom,guard,guardproc,earlyoom-big,guard-big,guardproc-big"
    )
    p.add_argument("--give-up", type=float, default=300.0, help="seconds for the kernel alone")
    p.add_argument("--ballast-mb", type=int, default=320)
    p.add_argument(
        "--profile",
        choices=["debian", "ubuntu", "fedora"],
        default="debian",
        help="the host: Debian's default, or Ubuntu's or Fedora's swap and systemd-oomd",
    )
    p.add_argument("--manager", default="auto")
    p.add_argument(
        "--timeline",
        action="store_true",
        help="print each round's half-second timeline: memory, PSI, swap, lags, silent siblings",
    )
    p.add_argument(
        "--compact",
        action="store_true",
        help="compact the kernel's memory before each round (vm.compact_memory)",
    )
    p.add_argument("--idle-agents", type=int, default=50)
    p.add_argument("--idle-seconds", type=float, default=15.0)
    p.add_argument("--idle-pairs", type=int, default=3)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
