"""The host commands: doctor, gc, install, uninstall, demo.

What only one command needs (the doctor's checks, rich, subprocess) is
imported by that command (issue 28).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from ._context import emit_json, fleet_of, history_of, options, said, show
from ._errors import BadInput, Failed
from ._parse import duration_option, parse_duration, parse_size, whole_option

__all__ = ["demo", "doctor", "gc", "install", "uninstall"]


def doctor(
    ctx: typer.Context,
    fix: Annotated[bool, typer.Option(help="Clear the agents slice's runtime limits.")] = False,
) -> None:
    """Check this host for what agentscope needs, one line per check.

    Exits 1 when a check fails, 4 when systemd is unreachable and the fleet
    needs it (the systemd mode: docs/containers.md).

    Examples:

    \b
      agentscope doctor
      agentscope --user doctor --fix
    """
    from . import _doctor, _render

    opts = options(ctx)
    facts = _doctor.gather(opts)
    results = _doctor.checks(facts)
    if fix and any(c["name"] == "slice_limits" and c["status"] == "fail" for c in results):
        _clear_slice_limits(ctx)
        facts = _doctor.gather(opts)
        results = _doctor.checks(facts)
    version = facts.capabilities["systemd_version"] if facts.capabilities else None
    if opts.json:
        emit_json(
            "doctor",
            {
                "systemd_version": version,
                "manager": facts.manager,
                "mode": facts.mode,
                "checks": results,
            },
        )
    else:
        show(_render.doctor_view(version, facts.manager, results))
    if facts.capabilities is None and not _doctor.runs_without_systemd(facts):
        raise typer.Exit(4)
    if any(c["status"] == "fail" for c in results):
        raise typer.Exit(1)


def _clear_slice_limits(ctx: typer.Context) -> None:
    with fleet_of(ctx) as fleet:
        fleet.clear_slice_limits()


def gc(
    ctx: typer.Context,
    retention: Annotated[
        str,
        typer.Option(
            help="Keep exited agents younger than this time span (10min, 1h30min, 7d).",
            metavar="SPAN",
        ),
    ] = "7d",
) -> None:
    """Forget exited agents (and their records) older than the retention.

    Reads and writes the registry file alone: works without systemd.

    Examples:

    \b
      agentscope gc --retention 1d
    """
    seconds = parse_duration(retention)
    with history_of(ctx) as history:
        removed = history.gc(retention_seconds=seconds)
    said(
        ctx,
        "gc",
        {"removed": removed, "retention_seconds": seconds},
        f"removed {removed} agent(s)",
    )


def _run_actions(actions: Sequence[Sequence[str]], as_json: bool) -> None:
    import subprocess

    for argv in actions:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        except OSError as exc:  # no systemctl here, say
            raise Failed(f"{' '.join(argv)} could not be run: {exc.strerror}", "failed") from exc
        if done.returncode != 0:
            raise Failed(
                f"{' '.join(argv)} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}",
                "failed",
            )
        if not as_json:
            sys.stdout.write(f"ran: {' '.join(argv)}\n")


def install(
    ctx: typer.Context,
    linger: Annotated[
        bool, typer.Option(help="Also enable linger (user managers at boot).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be written.")
    ] = False,
    mglru_protection: Annotated[
        bool,
        typer.Option(
            "--mglru-protection",
            help="Also turn on the kernel's MGLRU thrashing protection at boot "
            "(min_ttl_ms=1000, a tmpfiles.d line; --system only; uninstall removes it).",
        ),
    ] = False,
) -> None:
    """Install the agents slice (no memory limits) and the monitor service for --fleet.

    For the manager of --user or --system (the global options; root: system).

    Examples:

    \b
      agentscope install --user --linger
      sudo agentscope install --system --dry-run
    """
    from agentscope_systemd import install as inst

    scope = options(ctx).resolved_manager
    if scope == "system" and linger:
        raise BadInput("--linger is for a user install (--user): the system manager runs at boot")
    if scope == "system" and os.geteuid() != 0:
        raise BadInput("install --system needs root; use --user for your own manager")
    if mglru_protection and scope != "system":
        raise BadInput("--mglru-protection is host-wide: use it with install --system (root)")
    plan = inst.plan_install(
        scope,  # type: ignore[arg-type]
        systemd_version=inst.detect_systemd_version(),
        linger=linger,
        fleets=[options(ctx).fleet],
        mglru_min_ttl_ms=inst.MGLRU_MIN_TTL_DEFAULT if mglru_protection else None,
    )
    first = inst.load_manifest(scope) is None  # type: ignore[arg-type]
    try:
        lines = inst.apply_plan(plan, dry_run=dry_run)
    except inst.UntrustedExecutable as exc:  # the command's own input: exit 2
        raise BadInput(str(exc)) from exc
    if not dry_run:
        reload, rest = plan.actions[:1], plan.actions[1:]
        try:
            _run_actions(reload, options(ctx).json)
        except Failed as exc:
            # The manager never read the files: a first install takes them
            # back, so a failed install leaves nothing behind (#28).
            if first:
                _take_back(scope)
                message = f"{exc}; nothing was installed (the files are removed)"
                raise Failed(message, exc.kind) from exc
            raise
        _run_actions(rest, options(ctx).json)
    said(ctx, "install", {"scope": scope, "dry_run": dry_run, "done": lines}, "\n".join(lines))


def _take_back(scope: str) -> None:
    """Remove what the install just wrote (its manifest says what), running no command."""
    import dataclasses

    from agentscope_systemd import install as inst

    manifest = inst.load_manifest(scope)  # type: ignore[arg-type]
    if manifest is not None:
        inst.apply_plan(dataclasses.replace(inst.plan_uninstall(manifest), actions=()))


def uninstall(
    ctx: typer.Context,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be removed.")
    ] = False,
) -> None:
    """Remove exactly what install wrote for --user or --system (agents keep running).

    Examples:

    \b
      agentscope uninstall --user --dry-run
    """
    from agentscope_systemd import install as inst

    scope = options(ctx).resolved_manager
    manifest = inst.load_manifest(scope)  # type: ignore[arg-type]
    if manifest is None:
        raise Failed(f"nothing to uninstall: no {scope} install of agentscope found", "failed")
    plan = inst.plan_uninstall(manifest)
    lines = inst.apply_plan(plan, dry_run=dry_run)
    if not dry_run:
        _run_actions(plan.actions, options(ctx).json)
    said(ctx, "install", {"scope": scope, "dry_run": dry_run, "done": lines}, "\n".join(lines))


def demo(
    ctx: typer.Context,
    agents: Annotated[
        int,
        typer.Option(
            help="How many agents to launch, 2-64 (one of them runs away).",
            parser=whole_option("--agents", 2, 64),
        ),
    ] = 8,
    memory_max: Annotated[
        str,
        typer.Option(
            help="The runaway's own cap (SIZE), so this machine is never squeezed.",
            metavar="SIZE",
        ),
    ] = "256M",
    global_oom: Annotated[
        bool,
        typer.Option(
            "--global-oom",
            help="No cap: let the tool call run the whole machine short, for the guard to "
            "catch. Only in a throwaway VM.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            help="How long to wait for the kill: a time span (150, 5min; 1s to 1d).",
            parser=duration_option("--timeout", 1, 86400),
            metavar="SPAN",
        ),
    ] = 150.0,
) -> None:
    """Show what agentscope does: a fleet, a runaway agent, its kill named.

    Launches cheap agents (fleet "demo" unless --fleet), starts the monitor
    with its memory guard, lets one agent's tool call grow until it is killed
    (by the kernel in its capped scope; with --global-oom by the guard), then shows
    the survivors, the slice's limits and the memory report, and stops every
    agent it started (also on Ctrl-C). Exits 0 only if every outcome happened.

    Examples:

    \b
      agentscope demo --agents 4 --timeout 5min
    """
    from ._demo import DemoSettings, run_demo

    cap = None if global_oom else parse_size(memory_max)
    if cap is None and not global_oom:
        raise BadInput("demo --memory-max infinity is no cap: use --global-oom (a throwaway VM)")
    run_demo(options(ctx), DemoSettings(agents=agents, memory_max=cap, timeout=timeout))
