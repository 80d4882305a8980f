"""Where a launch spends its time: per-phase medians of ``launch()`` + ``wait()``.

Run inside a VM of the test bed (``make bench BENCH=bench_launch_phases.py``).
The library is not instrumented: this script wraps a few of its internals
from outside (the registry trips, the D-Bus calls, the gated child's
``Popen`` and gate) and stamps ``time.perf_counter_ns`` around them, so the
private names it wraps may move. It prints the median of each phase over
``BENCH_N`` launches back to back, then over 20 launches each 0.5 s after
the previous exit, the floor (``bench_launch._job_floor``) and the cost of
a ``Popen`` with and without a ``preexec_fn`` (fork instead of vfork).
Where the compiled gate is installed and no ``agentscope_base`` is given,
launches alternate between it and the Python gate instead.

To compare two versions under the same load (a TCG guest shares its host),
put a copy of the other version's ``agentscope`` package next to this file
as ``agentscope_base``: launches then alternate between the two, each with
its own registry file, and both columns are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import statistics
import subprocess
import sys
import time
import types
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import agentscope_systemd
from agentscope_systemd._registry._registry import default_registry_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_launch import _job_floor

N = int(os.environ.get("BENCH_N", "50"))
_BLOCK = 5
_SPACE = 0.5  # seconds between an agent's exit and the next launch, in the spaced pass

# The current launch's stamps (name -> perf_counter_ns, first one wins) and
# registry trips (function, submitted, started, ended, resumed).
_stamps: dict[str, int] = {}
_trips: list[tuple[str, int, int, int, int]] = []
# The gated child writes its own stamps here (perf_counter_ns is
# CLOCK_MONOTONIC: one clock for every process).
_child_r, _child_w = os.pipe()
os.set_blocking(_child_r, False)


def _mark(name: str) -> None:
    _stamps.setdefault(name, time.perf_counter_ns())


def _read_child_stamps() -> None:
    try:
        data = os.read(_child_r, 65536)
    except BlockingIOError:
        return
    for line in data.decode().splitlines():
        name, value = line.split()
        _stamps.setdefault(name, int(value))


def _spawn_of(pkg: types.ModuleType) -> types.ModuleType:
    return importlib.import_module(f"{pkg.__name__}._fleet._spawn")


def _instrument_package(pkg: types.ModuleType) -> None:
    fleet_mod = importlib.import_module(f"{pkg.__name__}._fleet._fleet_launch")
    spawn_mod = _spawn_of(pkg)
    orig_spawn = fleet_mod.spawn_gated

    async def spawn_gated(*args: Any, **kwargs: Any) -> Any:
        _mark("spawn:begin")
        child = await orig_spawn(*args, **kwargs)
        _mark("spawn:pid")
        orig_release = child.release

        async def release() -> Any:
            _mark("release:begin")
            try:
                return await orig_release()
            finally:
                _mark("release:end")

        child.release = release
        return child

    fleet_mod.spawn_gated = spawn_gated

    class Popen(subprocess.Popen):  # type: ignore[type-arg]
        # Only the spawn module sees this class: every Popen here is a launch's.
        # With the Python gate it returns at the agent's exec; with the
        # compiled gate, at the gate program's (its "ready" is spawn:pid).
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _mark("popen:enter")
            super().__init__(*args, **kwargs)
            _mark("popen:exec")

    shim = types.ModuleType("subprocess")
    shim.__dict__.update(subprocess.__dict__)
    shim.Popen = Popen  # type: ignore[attr-defined]
    spawn_mod.subprocess = shim

    orig_gate = spawn_mod._gate

    def gate(*args: Any) -> None:  # runs in the forked child: os calls only
        os.write(_child_w, b"gate:enter %d\n" % time.perf_counter_ns())
        orig_gate(*args)
        os.write(_child_w, b"gate:open %d\n" % time.perf_counter_ns())

    spawn_mod._gate = gate

    agent_cls = importlib.import_module(f"{pkg.__name__}._fleet._agent").Agent
    orig_reap = agent_cls._reap

    def reap(self: Any) -> int | None:
        _mark("exit:seen")
        result: int | None = orig_reap(self)
        return result

    agent_cls._reap = reap


def _instrument_fleet(fleet: Any) -> None:
    orig_db = fleet._store.call

    async def db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        times: dict[str, int] = {}

        def run() -> Any:
            times["start"] = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                times["end"] = time.perf_counter_ns()

        submit = time.perf_counter_ns()
        try:
            return await orig_db(run)
        finally:
            if "end" in times:  # else cancelled before it ran
                label = getattr(getattr(fn, "func", fn), "__name__", "?")
                resumed = time.perf_counter_ns()
                _trips.append((label, submit, times["start"], times["end"], resumed))

    fleet._store.call = db
    orig_scope = fleet._manager.start_scope

    async def start_scope(*args: Any, **kwargs: Any) -> Any:
        try:
            return await orig_scope(*args, **kwargs)
        finally:
            _mark("scope:end")

    fleet._manager.start_scope = start_scope
    bus = fleet._manager._bus  # the SystemdManager's connection
    orig_call = bus.call

    async def call(member: str, *args: Any, **kwargs: Any) -> Any:
        _mark(f"call:{member}:begin")
        try:
            return await orig_call(member, *args, **kwargs)
        finally:
            _mark(f"call:{member}:reply")

    bus.call = call

    def on_message(msg: Any) -> bool:
        if msg.member == "JobRemoved":
            _mark("jobremoved")
        return False

    bus._bus.add_message_handler(on_message)


# (label, from, to, gate): the phases printed, in launch order; a gate's own
# phases only for launches through it. The compiled program is exec'd by
# Popen at once and says "ready"; the Python gate runs in preexec_fn, and
# Popen returns at the agent's exec.
_PHASES = [
    ("checks, refusal, slice: until the fork", "launch:begin", "spawn:begin", None),
    ("spawn thread start until Popen", "spawn:begin", "popen:enter", None),
    ("program: vfork + exec of the gate", "popen:enter", "popen:exec", "program"),
    ("program: gate until ready on the loop", "popen:exec", "spawn:pid", "program"),
    ("python: fork + after-fork hooks", "popen:enter", "gate:enter", "python"),
    ("python: gate entered until PID on loop", "gate:enter", "spawn:pid", "python"),
    ("record_launch until StartTransientUnit", "spawn:pid", "call:StartTransientUnit:begin", None),
    (
        "StartTransientUnit until its reply",
        "call:StartTransientUnit:begin",
        "call:StartTransientUnit:reply",
        None,
    ),
    ("reply until JobRemoved", "call:StartTransientUnit:reply", "jobremoved", None),
    ("JobRemoved until go", "jobremoved", "release:begin", None),
    ("program: go until the agent's exec seen", "release:begin", "release:end", "program"),
    ("python: go until the gate opens (child)", "release:begin", "gate:open", "python"),
    ("python: gate open until exec seen", "gate:open", "popen:exec", "python"),
    ("python: exec seen until the loop resumes", "popen:exec", "release:end", "python"),
    ("mark running + rest of launch()", "release:end", "launch:end", None),
    ("true runs until its pidfd fires", "launch:end", "exit:seen", None),
    ("pidfd until wait() returns", "exit:seen", "wait:end", None),
    ("TOTAL launch + wait", "launch:begin", "wait:end", None),
]


def _use_gate(pkg: types.ModuleType, gate: str) -> None:
    """Launch ``pkg``'s next agents through ``gate``: "program" (if installed) or "python"."""
    spawn = _spawn_of(pkg)
    if not hasattr(spawn, "_PROGRAM"):
        return  # a version from before the compiled gate
    installed = spawn._PROGRAM.with_name("agentscope-gate")
    spawn._PROGRAM = installed if gate == "program" else installed.with_name("no-gate-here")


def _gate_of(pkg: types.ModuleType) -> str:
    has = getattr(_spawn_of(pkg), "gate_program", None)
    return "program" if has is not None and has() is not None else "python"


async def _one(
    fleet: Any,
    name: str,
    trips: list[tuple[str, int, int, int, int]],
    errors: list[str],
    pause: float = 0.0,
) -> dict[str, int]:
    _stamps.clear()
    _mark("launch:begin")
    try:
        agent = await fleet.launch(name, ["true"])
    except Exception as exc:  # counted and shown: a launch that fails is a finding too
        errors.append(f"{type(exc).__name__}: {exc}")
        _trips.clear()
        return {}
    _mark("launch:end")
    await agent.wait()
    _mark("wait:end")
    if pause:
        await asyncio.sleep(pause)
    _read_child_stamps()
    trips.extend(_trips)
    _trips.clear()
    return dict(_stamps)


def _popen_costs(n: int) -> tuple[float, float]:
    """Median ms of Popen(["true"]) + wait, without and with a preexec_fn (fork, not vfork)."""
    plain, gated = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.Popen(["true"]).wait()
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.Popen(["true"], preexec_fn=lambda: None).wait()
        gated.append(time.perf_counter() - t0)
    return statistics.median(plain) * 1000, statistics.median(gated) * 1000


def _fork_costs(n: int) -> tuple[float, float]:
    """Median ms of a bare os.fork() in the parent, and from the call until the child runs."""
    parent, child = [], []
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads
        for _ in range(n):
            t0 = time.perf_counter_ns()
            pid = os.fork()
            if pid == 0:
                os.write(w, b"%d\n" % time.perf_counter_ns())
                os._exit(0)
            t1 = time.perf_counter_ns()
            started = int(os.read(r, 64))
            os.waitpid(pid, 0)
            parent.append((t1 - t0) / 1e6)
            child.append((started - t0) / 1e6)
    os.close(r)
    os.close(w)
    return statistics.median(parent), statistics.median(child)


def _median(runs: list[dict[str, int]], a: str, b: str) -> str:
    vals = [(r[b] - r[a]) / 1e6 for r in runs if a in r and b in r]
    return f"{statistics.median(vals):8.2f}" if vals else f"{'-':>8s}"


def _table(runs: dict[str, list[dict[str, int]]], labels: list[str], gates: dict[str, str]) -> None:
    print(f"  {'phase':42s}" + "".join(f"{label:>8s}" for label in labels))
    print(f"  {'gate':42s}" + "".join(f"{gates[label]:>8s}" for label in labels))
    for name, a, b, gate in _PHASES:
        cells = (
            _median(runs[label], a, b) if gate in (None, gates[label]) else f"{'-':>8s}"
            for label in labels
        )
        print(f"  {name:42s}" + "".join(cells))


async def main() -> None:
    variants: list[tuple[str, types.ModuleType]] = [("this", agentscope_systemd)]
    with contextlib.suppress(ImportError):
        variants.insert(0, ("base", importlib.import_module("agentscope_base")))
    tag = uuid.uuid4().hex[:6]
    fleets: dict[str, Any] = {}
    trips: dict[str, list[tuple[str, int, int, int, int]]] = {}
    runs: dict[str, list[dict[str, int]]] = {}
    gates = {label: _gate_of(pkg) for label, pkg in variants}
    if len(variants) == 1 and gates["this"] == "program":
        variants = [("program", agentscope_systemd), ("python", agentscope_systemd)]
        gates = {"program": "program", "python": "python"}
    errors: dict[str, list[str]] = {label: [] for label, _ in variants}
    instrumented: set[str] = set()
    for label, pkg in variants:
        if pkg.__name__ not in instrumented:
            _instrument_package(pkg)
            instrumented.add(pkg.__name__)
        _use_gate(pkg, gates[label])
        fleet = pkg.AsyncFleet(f"ph{label}{tag}")
        # Each its own registry, next to the default one (same file system).
        fleet.registry_path = default_registry_path(fleet.manager).with_name(f"ph-{label}.db")
        await fleet.open()
        _instrument_fleet(fleet)
        fleets[label], trips[label], runs[label] = fleet, [], []
        for i in range(3):  # warm up: slice check, first round trips
            await _one(fleet, f"w{i}", [], [])
        await asyncio.gather(*fleet._tasks)
        _trips.clear()
    # Blocks of a few launches each, so that a launch overlaps the previous
    # exit's registry write of its own version, as in a plain sequence, and
    # never the other version's. Back to back, then spaced: launched right
    # after the previous agent's exit, a launch waits for systemd to finish
    # with that scope (its StartTransientUnit reply comes late), which
    # hides what the launch itself costs.
    spaced: dict[str, list[dict[str, int]]] = {label: [] for label, _ in variants}
    for out, count, pause in ((runs, N, 0.0), (spaced, min(N, 20), _SPACE)):
        for block in range(0, count, _BLOCK):
            order = variants if block // _BLOCK % 2 == 0 else variants[::-1]
            for label, pkg in order:
                _use_gate(pkg, gates[label])
                fleet = fleets[label]
                for i in range(block, min(block + _BLOCK, count)):
                    name = f"{'s' if pause else 'p'}{i}"
                    out[label].append(await _one(fleet, name, trips[label], errors[label], pause))
                await asyncio.gather(*fleet._tasks)
                _trips.clear()
    first = fleets[variants[0][0]]
    floor = statistics.median(await _job_floor(first.manager, first.slice, N))
    plain, gated = _popen_costs(20)
    forked, child_runs = _fork_costs(20)
    for fleet in fleets.values():
        await fleet.aclose()

    labels = [label for label, _ in variants]
    print(f"launch phases ({first.manager} manager, systemd {first.systemd_version}, ms, ", end="")
    print(f"median of {N}, {' and '.join(labels)} interleaved):")
    _table(runs, labels, gates)
    print(
        f"the same, each launch {_SPACE} s after the previous agent's exit, median of {min(N, 20)}:"
    )
    _table(spaced, labels, gates)
    print(f"  {'floor: StartTransientUnit until JobRemoved':42s}{floor * 1000:8.2f}")
    print("  registry trips (median ms of thread hops / time in the thread, count):")
    for label in labels:
        by_fn: dict[str, list[tuple[float, float]]] = {}
        for fn, submit, start, end, resume in trips[label]:
            hops = (start - submit + resume - end) / 1e6
            by_fn.setdefault(fn, []).append((hops, (end - start) / 1e6))
        for fn, vals in by_fn.items():
            hops = statistics.median(v[0] for v in vals)
            work = statistics.median(v[1] for v in vals)
            print(f"    {label:5s} {fn:24s} {hops:6.2f} / {work:6.2f}  x{len(vals)}")
    print(f"  Popen(['true']) + wait: {plain:.2f} ms (vfork), {gated:.2f} ms with a preexec_fn")
    print(f"  os.fork(): {forked:.2f} ms in the parent, {child_runs:.2f} ms until the child runs")
    for label in labels:
        for error in errors[label]:
            print(f"  {label}: a launch failed: {error}")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
