"""The CLI's own cost: ``agentscope exec`` against ``systemd-run --scope``, and ``ls --json``.

Run inside a VM of the test bed (``make bench BENCH=bench_cli.py``) or on any
systemd host, as root (system manager) or as a user with a user manager.

``--host``
    Start-up alone, on any host, no systemd needed: each command below run
    ``--runs`` times with a user manager whose bus cannot be reached and a
    registry in a temporary directory (empty: ``events`` prints nothing),
    bytecode cached as an installed wheel has it (``PYTHONDONTWRITEBYTECODE``
    dropped; the warm-up runs write the caches).
    With hyperfine installed (``apt-get install hyperfine``; ``--loop``
    not to use it) hyperfine runs them, after 3 warm-up runs each;
    otherwise this script, interleaved (one of each per round, the order
    rotating). Prints each command's median wall time, its CPU time (user +
    system, which another process on the machine disturbs less; hyperfine
    gives its mean, the loop its median) and both as a ratio to a bare
    ``python -c pass`` of the same interpreter. ``--source DIR`` runs the checkout in DIR
    (``python -c 'from agentscope_systemd._cli.main import main; main()'``) instead of the
    ``agentscope`` command, so that two commits can be measured alike, one
    run each. The commands: ``--version``; ``--help``; ``--json events``
    (an empty registry); ``--json ls``, ``ls`` and ``ls --help`` (``ls``
    fails at the bus, exit 4, after its start-up); ``stop NAME`` (exit 4
    alike); ``--json doctor``;
    ``exec --help``, ``exec`` of a command that is not there (exit 127
    before any scope) and ``call --help``.

``exec``
    ``agentscope exec NAME -q -- true`` against ``systemd-run --scope -q
    true`` (``--user`` for the user manager) and a bare ``python -c pass``
    of the interpreter the ``agentscope`` command runs on, interleaved, one
    of each per round (the order rotating), ``--rounds`` rounds. Python's
    own start-up dominates under TCG, so the wrapper's time less the bare
    interpreter's is what agentscope adds; the target is that remainder
    within 1.5x of systemd-run's time.
``ls``
    ``agentscope ls --json`` wall time with ``--agents`` agents running
    (default 100), median of 5; the output is parsed and must list them all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid

import agentscope_systemd


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _interpreter(script: str) -> str:
    """The interpreter of a console script (its shebang), else this one."""
    with open(script, "rb") as f:
        first = f.readline().decode(errors="replace")
    if first.startswith("#!") and os.path.isabs(first[2:].split()[0]):
        return first[2:].split()[0]
    return sys.executable


def bench_exec(cli: str, fleet: str, manager: str, rounds: int) -> dict[str, float]:
    user = ["--user"] if manager == "user" else []
    sides = {
        "exec": lambda i: [cli, "--fleet", fleet, "exec", f"e{i}", "-q", "--", "true"],
        "systemd-run": lambda i: ["systemd-run", *user, "--scope", "-q", "true"],
        "python": lambda i: [_interpreter(cli), "-c", "pass"],
    }
    names = list(sides)
    for name in names:  # warm the page cache and the slice
        _timed(sides[name](-1 - names.index(name)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(_timed(sides[name](i)))
    return {name: statistics.median(t) for name, t in times.items()}


def exec_path(cli: str, fleet: str) -> str:
    """Which path ``exec`` took: ``fast`` unless it imported dbus-fast (the library's)."""
    done = subprocess.run(
        [cli, "--fleet", fleet, "exec", "probe", "-q", "--", "true"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    return "slow (the library's Fleet.adopt)" if "dbus_fast" in done.stderr else "fast"


async def bench_ls(cli: str, fleet_name: str, manager: str, agents: int) -> tuple[float, int]:
    async with agentscope_systemd.AsyncFleet(fleet_name, manager) as fleet:
        names = []
        try:
            for i in range(agents):
                agent = await fleet.launch(
                    f"l{i:03d}",
                    ["sleep", "600"],
                    stdout=agentscope_systemd.DEVNULL,
                    stderr=agentscope_systemd.DEVNULL,
                )
                names.append(agent.name)
            cmd = [cli, "--fleet", fleet_name, "ls", "--json"]
            walls, listed = [], 0
            for _ in range(5):
                t0 = time.perf_counter()
                out = await asyncio.to_thread(
                    subprocess.run, cmd, check=True, capture_output=True, text=True
                )
                walls.append(time.perf_counter() - t0)
                listed = len(json.loads(out.stdout))
            return statistics.median(walls), listed
        finally:
            for name in names:
                await fleet.kill(name, 9)


# The commands of --host: (label, arguments after the global --user).
HOST_COMMANDS = (
    ("--version", ["--version"]),
    ("--help", ["--help"]),
    ("--json events", ["--json", "events"]),
    ("--json ls (exit 4)", ["--json", "ls"]),
    ("ls (exit 4)", ["ls"]),
    ("ls --help", ["ls", "--help"]),
    ("stop NAME (exit 4)", ["stop", "b"]),
    ("--json doctor", ["--json", "doctor"]),
    ("exec --help", ["exec", "--help"]),
    ("exec -- missing (exit 127)", ["exec", "b", "--", "no-such-command-agentscope"]),
    ("call --help", ["call", "--help"]),
)


def _run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and exit status of one run of ``cmd``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def bench_host(
    prefix: list[str], python: str, runs: int, *, hyperfine: str | None = None
) -> dict[str, tuple[float, float, int]]:
    """Median wall and CPU seconds and the exit status of each of :data:`HOST_COMMANDS`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        # Bytecode cached, as an installed wheel runs (pip compiles at install):
        # with PYTHONDONTWRITEBYTECODE set (as in this project's sessions), a
        # --source checkout compiled every module of its own at every start,
        # about a third of `ls`'s CPU time (docs/benchmarks.md).
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "XDG_STATE_HOME": f"{tmp}/state",
            "XDG_RUNTIME_DIR": f"{tmp}/run",
            "DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp}/no-bus",
            "COLUMNS": "100",
        }
        sides = {"python -c pass": [python, "-c", "pass"]}
        sides |= {label: [*prefix, "--user", *args] for label, args in HOST_COMMANDS}
        if hyperfine is not None:
            return _hyperfine(hyperfine, sides, env, runs, f"{tmp}/hyperfine.json")
        names = list(sides)
        for name in names:  # warm the page cache and the bytecode caches
            _run_measured(sides[name], env)
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float]] = {name: [] for name in names}
        codes: dict[str, int] = {}
        for i in range(runs):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                wall, cpu, codes[name] = _run_measured(sides[name], env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    return {
        name: (statistics.median(walls[name]), statistics.median(cpus[name]), codes[name])
        for name in names
    }


def _hyperfine(
    tool: str, sides: dict[str, list[str]], env: dict[str, str], runs: int, out: str
) -> dict[str, tuple[float, float, int]]:
    """:func:`bench_host`'s figures measured by hyperfine (no shell, 3 warm-up runs)."""
    import shlex

    codes = {}
    for name, cmd in sides.items():  # the exit status, which hyperfine does not report
        codes[name] = _run_measured(cmd, env)[2]
    argv = [tool, "-N", "-i", "--style", "none", "--warmup", "3", "--runs", str(runs)]
    argv += ["--export-json", out]
    for name, cmd in sides.items():
        argv += [f"--command-name={name}", shlex.join(cmd)]
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        results = json.load(f)["results"]
    return {
        r["command"]: (r["median"], r["user"] + r["system"], codes[r["command"]]) for r in results
    }


def host_main(source: str | None, runs: int, *, loop: bool = False) -> None:
    if source is not None:
        python = sys.executable
        code = (
            f"import sys; sys.path.insert(0, {source!r}); "
            "from agentscope_systemd._cli.main import main; main()"
        )
        prefix = [python, "-c", code]
        what = f"the checkout {source}"
    else:
        cli = shutil.which("agentscope")
        if cli is None:
            sys.exit("bench_cli: the agentscope command is not on PATH (or pass --source DIR)")
        python = _interpreter(cli)
        prefix = [cli]
        what = cli
    hyperfine = None if loop else shutil.which("hyperfine")
    how = "hyperfine" if hyperfine else "interleaved rounds"
    print(f"start-up of {what}, {runs} runs each ({how}), no systemd manager reachable:")
    results = bench_host(prefix, python, runs, hyperfine=hyperfine)
    base_wall, base_cpu, _ = results["python -c pass"]
    print(f"  {'command':<28} {'wall':>9} {'x python':>9} {'cpu':>9} {'x python':>9}  exit")
    for name, (wall, cpu, code) in results.items():
        print(
            f"  {name:<28} {wall * 1e3:6.1f} ms {wall / base_wall:8.1f}x "
            f"{cpu * 1e3:6.1f} ms {cpu / base_cpu:8.1f}x  {code}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--host", action="store_true", help="start-up only, no systemd needed")
    parser.add_argument("--source", help="with --host: the checkout to run, not agentscope")
    parser.add_argument("--runs", type=int, default=30, help="with --host: runs of each")
    parser.add_argument("--loop", action="store_true", help="with --host: not hyperfine")
    args = parser.parse_args()
    if args.host:
        host_main(args.source, args.runs, loop=args.loop)
        return
    cli = shutil.which("agentscope")
    if cli is None:
        sys.exit("bench_cli: the agentscope command is not on PATH")
    manager = "system" if os.geteuid() == 0 else "user"
    fleet = f"bcli{uuid.uuid4().hex[:6]}"

    med = bench_exec(cli, fleet, manager, args.rounds)
    extra = med["exec"] - med["python"]
    print(f"exec ({manager} manager, median of {args.rounds} interleaved rounds):")
    print(f"  agentscope exec -- true      {med['exec'] * 1e3:8.1f} ms")
    print(f"  systemd-run --scope true     {med['systemd-run'] * 1e3:8.1f} ms")
    print(f"  bare python -c pass          {med['python'] * 1e3:8.1f} ms")
    print(f"  exec less bare python        {extra * 1e3:8.1f} ms")
    print(
        f"  (exec - python) / systemd-run {extra / med['systemd-run']:7.2f}x  (target <= 1.5x); "
        f"exec / systemd-run {med['exec'] / med['systemd-run']:.2f}x"
    )
    print(f"  path taken: {exec_path(cli, fleet)}", flush=True)
    wall, listed = asyncio.run(bench_ls(cli, f"{fleet}l", manager, args.agents))
    print(
        f"ls --json with {args.agents} agents: {wall * 1e3:.0f} ms wall (median of 5), "
        f"{listed} listed"
    )
    if listed < args.agents:
        sys.exit(f"bench_cli: ls listed {listed} of {args.agents} agents")


if __name__ == "__main__":
    main()
