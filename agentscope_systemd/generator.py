#!/usr/bin/env python3
"""agentscope-generator: the agents slice and the fleet monitors, from one config file.

A systemd generator (systemd.generator(7)), installed by ``agentscope install
--system`` as ``/usr/local/lib/systemd/system-generators/agentscope-generator``
and ``.../user-generators/agentscope-generator``. On boot and on every
daemon-reload the manager runs it with three output directories (normal,
early, late); it writes into the normal one only:

- the agents slice (``app-agentscope-agents.slice`` unless configured),
- the monitor template ``agentscope-monitor@.service``,
- one wants link per fleet, ``multi-user.target.wants/`` for the system
  manager and ``default.target.wants/`` for user managers, pointing at
  ``../agentscope-monitor@.service``,
- the systemd-oomd drop-ins (``50-agentscope-oomd.conf``) of the agents
  slice, the monitor's slice, the agent scopes (``agentscope-.scope.d/``)
  and the monitor template: see :func:`oomd_dropins`.

Units in the normal directory rank below /etc and /run, so an administrator
can still override anything with ``systemctl edit``.

The config file is read and checked in its other half, ``_genconfig.py``;
``agentscope install`` joins the two into the one file it installs.

Rules it keeps (systemd.generator(7)): standard library only (it imports
nothing else from agentscope but its other half, so it runs on the system's
python3 whatever virtual environment agentscope lives in), no D-Bus and no
subprocess, nothing written outside the output directory, fast (it runs
before most of boot).
An unreadable or invalid config never fails boot or daemon-reload: the
problem is logged (to /dev/kmsg when writable and ``$SYSTEMD_LOG_TARGET`` is
not ``console``, else to stderr, prefixed ``agentscope-generator:``), every
invalid value is replaced by its default, and the exit status is 0.

Manager detection: ``--user`` or ``--system`` on the command line wins; then
``$SYSTEMD_SCOPE`` (``system`` or ``user``, set for generators by systemd 251
and later); then the directory it was started from (``user-generators``);
else system. The config path is ``/etc/agentscope/agentscope.toml``, or
``$AGENTSCOPE_CONFIG`` when set (for tests).

Run it by hand to see what it would generate::

    python3 -I agentscope_systemd/generator.py --user /tmp/out
"""

from __future__ import annotations

import os
import sys

# Not `from typing import TYPE_CHECKING`: importing typing costs about 9 ms, a
# third of this generator's run time without a config file.
TYPE_CHECKING = False

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_EXEC",
    "DEFAULT_FLEETS",
    "DEFAULT_PRESSURE_LIMIT",
    "DEFAULT_SLICE",
    "DEFAULT_WATCHDOG_SEC",
    "GUARD_OPTIONS",
    "MONITOR_TEMPLATE",
    "OOMD_DROPIN",
    "TEMPLATE_FILES",
    "Config",
    "FleetEntry",
    "Rendered",
    "find_templates",
    "load_config",
    "main",
    "monitor_slice",
    "oomd_dropins",
    "parse_config",
    "render",
    "select_fleets",
    "validate_exec",
    "validate_fleet_name",
    "validate_pressure_limit",
    "validate_slice_name",
    "write_rendered",
]

DEFAULT_CONFIG_PATH = "/etc/agentscope/agentscope.toml"
DEFAULT_EXEC = "/usr/local/bin/agentscope"
MONITOR_TEMPLATE = "agentscope-monitor@.service"
#: The file name of every systemd-oomd drop-in: numbered after the
#: distributions' ``10-`` ones (Ubuntu's, Fedora's systemd-oomd-defaults), so
#: that its values win (drop-ins apply in file name order, the last one wins).
OOMD_DROPIN = "50-agentscope-oomd.conf"

#: Template name -> file name in ``units/`` (``agentscope_systemd/_units/`` in a wheel).
TEMPLATE_FILES = {
    "slice": "app-agentscope-agents.slice",
    "monitor": "agentscope-monitor@.service",
    "oom_policy": "agentscope-oom-policy.conf",
}

# `agentscope install` replaces these two lines in the copy it installs, so
# that the installed generator is one self-contained file. Keep them as they are.
_EMBEDDED_TEMPLATES: dict[str, str] | None = None
_INSTALLED_EXEC: str | None = None

# The config file's half, _genconfig.py (the standard library only as well).
# `agentscope install` puts its code in place of this block, from here to the
# end marker, so that the installed generator is one file; run by path from a
# checkout or a wheel, this file imports it from beside itself.
if TYPE_CHECKING or __package__:
    from ._genconfig import (
        DEFAULT_FLEETS,
        DEFAULT_PRESSURE_LIMIT,
        DEFAULT_SLICE,
        DEFAULT_WATCHDOG_SEC,
        GUARD_OPTIONS,
        Config,
        FleetEntry,
        _Record,
        load_config,
        parse_config,
        validate_exec,
        validate_fleet_name,
        validate_pressure_limit,
        validate_slice_name,
    )
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _genconfig

    globals().update({k: v for k, v in vars(_genconfig).items() if not k.startswith("__")})
# The end of the config file's half.


class Rendered(_Record):
    """Generated output: relative path -> file text, relative path -> symlink target."""

    __slots__ = ("files", "links")
    files: dict[str, str]
    links: dict[str, str]

    def __init__(self, files: dict[str, str], links: dict[str, str]) -> None:
        super().__init__(files=files, links=links)


def monitor_slice(slice_name: str) -> str:
    """The slice the monitor runs in: the agents slice's parent.

    >>> monitor_slice("app-agentscope-agents.slice")
    'app-agentscope.slice'
    """
    return slice_name[: -len(".slice")].rpartition("-")[0] + ".slice"


def oomd_dropins(config: Config, header: str) -> dict[str, str]:
    """systemd-oomd's settings for the fleet's units, as drop-ins: relative path -> text.

    systemd-oomd kills a whole leaf cgroup, which is an agent's scope. These
    keep it from doing so before the monitor's guard, which kills only the
    runaway tool call (docs/install.md, "systemd-oomd"):

    - every agent scope (``agentscope-.scope.d/``, a prefix drop-in: transient
      scopes read it from systemd 252 on) and the monitor get
      ``ManagedOOMPreference=avoid``: oomd picks them last. oomd reads the
      preference on the candidate cgroup itself (not inherited from the
      slice), and honours it only when the candidate is root's or has the
      owner of the cgroup whose rule fired (systemd-oomd(8)).
    - the agents slice keeps one pressure rule of its own, slower than the
      guard (``ManagedOOMMemoryPressureLimit=`` of the config, for oomd's
      default duration, 20-30 s, against the guard's 10 s): a backstop where
      no guard runs. Its ``ManagedOOMSwap=auto``: the swap rule acts the
      moment memory and swap are 90 % used, leaving the guard no time.
    - the monitor's slice (the agents slice's parent) monitors nothing: a
      distribution's per-slice rule there would cover the agents again.
    """
    agents = config.slice_name
    return {
        f"{agents}.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            '# systemd-oomd and the agents (docs/install.md, "systemd-oomd"). Numbered\n'
            "# after the distributions' 10- drop-ins, so these values win.\n"
            "[Slice]\n"
            "# A backstop where no guard runs: after the slice's memory pressure stays\n"
            "# above the limit for oomd's DefaultMemoryPressureDurationSec= (20-30 s),\n"
            "# oomd kills the agent scope reclaiming most. The guard acts after 10 s\n"
            "# and kills only the runaway tool call.\n"
            "ManagedOOMMemoryPressure=kill\n"
            f"ManagedOOMMemoryPressureLimit={config.oomd_pressure_limit}\n"
            "# The swap rule kills at once (memory and swap 90 % used): not here.\n"
            "ManagedOOMSwap=auto\n"
            "# oomd reads the preference of each candidate itself: the scopes carry\n"
            "# theirs (agentscope-.scope.d/); this covers the slice as a leaf.\n"
            "ManagedOOMPreference=avoid\n"
        ),
        f"{monitor_slice(agents)}.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            "# The monitor's slice: no oomd rule of its own (a distribution's rule for\n"
            "# every slice would cover the agents below it again).\n"
            "[Slice]\n"
            "ManagedOOMMemoryPressure=auto\n"
            "ManagedOOMSwap=auto\n"
        ),
        f"agentscope-.scope.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            "# Every agent scope (agentscope-*.scope; transient units read drop-ins\n"
            "# from systemd 252 on): oomd kills other cgroups first. Honoured when the\n"
            "# scope is root's or has the owner of the cgroup whose rule fired (a user\n"
            "# manager's scopes: rules on user@UID.service and below, not -.slice's).\n"
            "[Scope]\n"
            "ManagedOOMPreference=avoid\n"
        ),
        f"{MONITOR_TEMPLATE}.d/{OOMD_DROPIN}": (
            f"# {header}\n"
            "# The monitor: oomd kills other cgroups first (same rule as the scopes').\n"
            "[Service]\n"
            "ManagedOOMPreference=avoid\n"
        ),
    }


def select_fleets(config: Config, *, user_mode: bool, user: str | None) -> list[str]:
    """The fleets whose monitor this manager starts at boot.

    The system manager starts the ``manager = "system"`` fleets; a user
    manager those with ``manager = "user"`` whose ``users`` is unset or
    names ``user``.
    """
    wanted = "user" if user_mode else "system"
    return [
        f.name
        for f in config.fleets
        if f.manager == wanted and (not user_mode or f.users is None or user in f.users)
    ]


def render(
    config: Config,
    templates: dict[str, str],
    *,
    user_mode: bool,
    fleets: list[str],
    header: str,
) -> Rendered:
    """Fill in the templates: the slice, the monitor template, the systemd-oomd drop-ins
    (:func:`oomd_dropins`) and one wants link per fleet.

    ``header`` is a comment line put at the top of each file, saying where it
    came from. Paths are relative to the output (or unit) directory.
    """
    values = {
        "@AGENTS_SLICE@": config.slice_name,
        "@OOMD_PRESSURE_LIMIT@": config.oomd_pressure_limit,
        "@MONITOR_EXEC@": config.monitor_exec or DEFAULT_EXEC,
        "@WATCHDOG_SEC@": f"{config.watchdog_sec}s",
        "@MONITOR_SLICE@": monitor_slice(config.slice_name),
        "@WANTED_BY@": "default.target" if user_mode else "multi-user.target",
        "@MANAGER@": "user" if user_mode else "system",
        "@GUARD@": " ".join(("--guard" if config.guard else "--no-guard", *config.guard_args)),
    }

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace(key, value)
        return f"# {header}\n{text}"

    target = "default.target" if user_mode else "multi-user.target"
    files = {
        config.slice_name: fill(templates["slice"]),
        MONITOR_TEMPLATE: fill(templates["monitor"]),
        **oomd_dropins(config, header),
    }
    links = {
        f"{target}.wants/agentscope-monitor@{name}.service": f"../{MONITOR_TEMPLATE}"
        for name in fleets
    }
    return Rendered(files, links)


def find_templates() -> dict[str, str]:
    """The unit templates: embedded in an installed generator, else read from disk.

    Looks in ``_units/`` next to this file (a wheel) and ``../units/`` (a
    source checkout).

    Raises:
        FileNotFoundError: no template directory was found.
    """
    if _EMBEDDED_TEMPLATES is not None:
        return dict(_EMBEDDED_TEMPLATES)
    here = os.path.dirname(os.path.abspath(__file__))
    for directory in (os.path.join(here, "_units"), os.path.join(here, os.pardir, "units")):
        if os.path.isdir(directory):
            templates = {}
            for key, name in TEMPLATE_FILES.items():
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    templates[key] = f.read()
            return templates
    raise FileNotFoundError(f"no unit templates in {here}/_units or {here}/../units")


def write_rendered(outdir: str, rendered: Rendered) -> None:
    """Write files (mode 0644) and symlinks under ``outdir``, and nowhere else.

    Raises:
        ValueError: a relative path would leave ``outdir``.
        OSError: from writing.
    """
    base = os.path.abspath(outdir)

    def place(relative: str) -> str:
        path = os.path.normpath(os.path.join(base, relative))
        if not path.startswith(base + os.sep):
            raise ValueError(f"{relative!r} is outside {base}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        return path

    for relative, text in rendered.files.items():
        fd = os.open(place(relative), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        with open(fd, "w", encoding="utf-8") as f:
            os.fchmod(fd, 0o644)
            f.write(text)
    for relative, target in rendered.links.items():
        os.symlink(target, place(relative))


def _log(message: str) -> None:
    """Log one line where generator output is seen: the kernel log, else stderr.

    systemd's own generators do the same (log_setup_generator): /dev/kmsg is
    writable by the system manager's generators early in boot, when nothing
    else is listening; user generators fall back to stderr, which the user
    manager puts in its journal.
    """
    line = f"agentscope-generator: {message}"[:900]
    if os.environ.get("SYSTEMD_LOG_TARGET", "") not in ("console", "console-prefixed"):
        try:
            fd = os.open("/dev/kmsg", os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError:
            pass
        else:
            try:
                os.write(fd, f"<4>{line}\n".encode("utf-8", "replace"))
                return
            except OSError:
                pass
            finally:
                os.close(fd)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _default_exec(argv0: str) -> str:
    # An installed generator knows where install found agentscope; a
    # generator started from a virtual environment's bin/ looks next to itself.
    if _INSTALLED_EXEC is not None:
        return _INSTALLED_EXEC
    beside = os.path.join(os.path.dirname(os.path.realpath(argv0)), "agentscope")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return DEFAULT_EXEC


def _user_mode(flags: set[str], argv0: str) -> bool:
    if "--user" in flags:
        return True
    if "--system" in flags:
        return False
    scope = os.environ.get("SYSTEMD_SCOPE")
    if scope in ("user", "system"):
        return scope == "user"
    return os.path.basename(os.path.dirname(os.path.abspath(argv0))) == "user-generators"


USAGE = "usage: agentscope-generator [--user|--system] NORMAL_DIR [EARLY_DIR LATE_DIR]"
HELP = """\
The systemd generator of agentscope (systemd.generator(7)): writes the agents
slice, the monitor template, one wants link per fleet and the systemd-oomd
drop-ins into NORMAL_DIR, from /etc/agentscope/agentscope.toml
($AGENTSCOPE_CONFIG). systemd runs it at boot and on every daemon-reload;
an invalid config is logged and never fails either. agentscope install puts
it in place.

Options:
  --user       generate for a user manager (else $SYSTEMD_SCOPE, else the
               directory it runs from: user-generators)
  --system     generate for the system manager
  -h, --help   show this message and exit

Example:
  agentscope-generator --user /tmp/out    # see what it would generate
"""


def main(argv: list[str] | None = None) -> int:
    """Generate into the first (normal) output directory; 0 unless it could not write.

    Usage: ``agentscope-generator [--user|--system] NORMAL [EARLY LATE]``.
    """
    args = list(sys.argv if argv is None else argv)
    argv0, rest = (args[0] if args else "agentscope-generator"), args[1:]
    if "-h" in rest or "--help" in rest:
        sys.stdout.write(f"{USAGE}\n\n{HELP}")
        return 0
    flags = {a for a in rest if a.startswith("--")}
    dirs = [a for a in rest if not a.startswith("--")]
    if len(dirs) not in (1, 3) or flags - {"--user", "--system"}:
        sys.stderr.write(f"{USAGE}\nTry 'agentscope-generator --help' for help.\n")
        return 2
    user_mode = _user_mode(flags, argv0)
    path = os.environ.get("AGENTSCOPE_CONFIG") or DEFAULT_CONFIG_PATH
    config, problems = load_config(path)
    if config.monitor_exec is None:
        config = config.replace(monitor_exec=_default_exec(argv0))
    for problem in problems:
        _log(problem)
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    fleets = select_fleets(config, user_mode=user_mode, user=user)
    header = f"Generated by agentscope-generator from {path}; edit that file, not this one."
    rendered = render(config, find_templates(), user_mode=user_mode, fleets=fleets, header=header)
    write_rendered(dirs[0], rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
