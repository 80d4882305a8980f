"""Agents in tmux: one private tmux server per fleet, in a scope of its own.

Every pane process is a child of the tmux server and is born in the server's
cgroup, and a server started from the manager would live (and die) in the
manager's cgroup. So the fleet's server runs in ``agentscope-<fleet>-tmux.scope``
under the fleet's slice (started through the same gated spawn as an agent,
with the manager's oom_score_adj), on a socket of its own under the runtime
directory, never the user's default server.

An agent's pane starts :data:`SHIM`, a few lines of bash that use only
builtins (no fork): it opens its launch FIFO, reads its spec (oom_score_adj,
cwd, environment, argv) from a file and blocks until the manager writes
"go", which it does once the agent's scope exists with the pane's PID in it
(the start job's ``JobRemoved``). Then the shim sets oom_score_adj and execs
the agent through ``env -i``, keeping its PID: the pane's PID is the
agent's. A launcher that goes away leaves a shim that gives up after
:data:`GO_TIMEOUT` seconds, and its window closes.

Every tmux command is a process spawn (libtmux runs ``tmux`` each time), so
the :class:`TmuxServer` methods are plain blocking functions that the fleet
runs off its event loop with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import _numbers
from .._errors import AgentscopeError, LaunchError, TmuxError, TmuxUnavailable, WindowExists
from .._kernel._proc import read_stat

if TYPE_CHECKING:
    import libtmux

__all__ = [
    "GO_TIMEOUT",
    "SHIM",
    "PaneLaunch",
    "TmuxServer",
    "Window",
    "at_gate",
    "exec_done",
    "last_lines",
    "not_a_tmux_agent",
    "parse_windows",
    "runtime_dir",
    "session_name",
    "socket_dir",
    "spec_bytes",
    "tmux_description",
    "tmux_unit",
]

GO_TIMEOUT = 90  # seconds a shim waits for "go" (StartTransientUnit itself times out at 60)
SHIM_TAG = "agentscope-shim"
ENV_TAG = "agentscope-env"
# env(1) takes every leading NAME=VALUE word as a variable, so an argv[0]
# holding "=" would be set, and argv[1] run. Such a command goes through sh,
# which never takes an expanded word for an assignment.
_SAFE_EXEC = ("/bin/sh", "-c", 'exec "$0" "$@"')
# $1: the launch FIFO, $2: the spec file (NUL-separated: oom_score_adj, cwd,
# number of environment entries, the entries, argv). Builtins only until the
# exec: nothing of the pane may fork before it is in the agent's scope. The
# pane's own TERM/TMUX/TMUX_PANE come last so they win over the caller's.
SHIM = f"""exec 3<>"$1" || exit 1
mapfile -d '' -t s <"$2" || exit 1
IFS= read -r -t {GO_TIMEOUT} -u 3 go || exit 1
[ "$go" = go ] || exit 1
exec 3<&-
echo "${{s[0]}}" >/proc/self/oom_score_adj || exit 1
cd -- "${{s[1]}}" || exit 1
n=${{s[2]}}
set --
[[ ${{s[3+n]}} == *=* ]] && set -- {" ".join(_SAFE_EXEC[:2])} '{_SAFE_EXEC[2]}'
exec -a {ENV_TAG} env -i -- "${{s[@]:3:n}}" TERM="$TERM" TMUX="$TMUX" TMUX_PANE="$TMUX_PANE" \\
  "$@" "${{s[@]:3+n}}"
"""
_FORMAT = "#{window_id}\t#{window_name}\t#{pane_pid}"
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the NUL


@dataclass(frozen=True)
class Window:
    """One window of the fleet's session: its id (``@3``), name and pane process."""

    id: str
    name: str
    pane_pid: int


def runtime_dir(manager: str, env: Mapping[str, str] | None = None) -> Path:
    """Where this manager's fleets keep their tmux sockets: ``/run/agentscope`` or the user's."""
    if manager == "system":
        return Path("/run/agentscope")
    env = os.environ if env is None else env
    return Path(env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}") / "agentscope"


def socket_dir(base: Path, fleet: str) -> Path:
    """The fleet's private directory: the socket, its config, the launch FIFOs."""
    return base / f"tmux-{fleet}"


def session_name(fleet: str) -> str:
    """The fleet's one session; tmux turns ``.`` and ``:`` in session names into ``_``."""
    return fleet.replace(".", "_")


def tmux_unit(fleet: str) -> str:
    """The scope the fleet's tmux server runs in."""
    return f"agentscope-{fleet}-tmux.scope"


def is_tmux_unit(unit: str) -> bool:
    """Whether ``unit`` is some fleet's tmux server scope (:func:`tmux_unit`).

    Never an agent's: an agent scope's name ends in ``-`` and six hex
    digits before ``.scope`` (``_names.scope_unit_name``).
    """
    return unit.startswith("agentscope-") and unit.endswith("-tmux.scope")


def tmux_description(fleet: str) -> str:
    """The server scope's Description; unlike an agent's, listings do not parse it."""
    return f"agentscope tmux server of fleet {fleet}"


def spec_bytes(oom_score_adj: int, cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> bytes:
    """What the shim reads with ``mapfile -d ''``: NUL-terminated fields."""
    fields = [str(oom_score_adj), cwd, str(len(env)), *(f"{k}={v}" for k, v in env.items())]
    fields += argv
    if any("\0" in f for f in fields):
        raise LaunchError("argv, env and cwd of a tmux agent must not contain NUL characters")
    return b"".join(f.encode() + b"\0" for f in fields)


def exec_done(cmdline: Sequence[str]) -> bool:
    """Whether a pane process has exec'd the agent (it is neither the shim nor its env)."""
    if len(cmdline) > 3 and cmdline[3] == SHIM_TAG:
        return False
    if tuple(cmdline[:3]) == _SAFE_EXEC:
        return False
    return not (cmdline and cmdline[0] == ENV_TAG)


def parse_windows(lines: Sequence[str]) -> list[Window]:
    """Windows from ``list-windows -F`` lines in :data:`_FORMAT`; odd lines are skipped."""
    out = []
    for line in lines:
        wid, sep, rest = line.partition("\t")
        name, sep2, pid = rest.rpartition("\t")
        if sep and sep2 and _numbers.is_digits(pid) and len(pid) <= 10:
            out.append(Window(wid, name, int(pid)))
    return out


def last_lines(lines: Sequence[str], n: int) -> list[str]:
    """The last ``n`` lines of a captured pane, without the blank screen below the text."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return list(lines[max(0, end - n) : end]) if n > 0 else []


def _wait_cmdline(
    pid: int, done: Callable[[list[str]], bool], timeout: float, gone: str | None
) -> None:
    """Poll /proc/PID/cmdline until ``done`` says so (a few ms: no event tells an exec).

    A process that ended raises LaunchError(``gone``), or returns if ``gone`` is None.
    """
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            raw = b""
        if raw:
            if done(raw.rstrip(b"\0").decode(errors="replace").split("\0")):
                return
        elif not _running(pid):  # gone, or a zombie the tmux server has not reaped yet
            if gone is None:
                return
            raise LaunchError(gone)
        # else: in the middle of an execve, cmdline reads empty for a moment
        if time.monotonic() > deadline:
            raise LaunchError(f"pid {pid} did not exec within {timeout:.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _running(pid: int) -> bool:
    try:
        st = read_stat(pid)
    except OSError:
        return False
    return st is not None and st.state != "Z"


def at_gate(cmdline: Sequence[str]) -> bool:
    """Whether a pane process runs the shim (tmux forked it, and it exec'd bash)."""
    return len(cmdline) > 3 and cmdline[3] == SHIM_TAG


def _no_session(stderr: Sequence[str]) -> bool:
    """Whether tmux said the target session does not exist (3.3: "no current target"
    when the server has no session at all, "can't find session" otherwise)."""
    return any("can't find session" in e or "no current target" in e for e in stderr)


def _libtmux() -> object:
    try:
        import libtmux
    except ImportError as exc:
        raise TmuxUnavailable(
            "libtmux is not installed; install agentscope with the tmux extra: "
            "pip install 'agentscope-systemd[tmux]'"
        ) from exc
    return libtmux


@dataclass
class PaneLaunch:
    """A pane whose shim waits for "go"; ``pid`` is the agent's PID to be."""

    server: TmuxServer
    window: str
    pid: int
    fifo: Path
    spec: Path
    fd: int

    def go(self, timeout: float = 30.0) -> None:
        """Release the shim; return once the agent exec'd (blocking).

        Raises:
            LaunchError: the pane's process ended before it exec'd the agent.
        """
        try:
            os.write(self.fd, b"go\n")
            # The FIFO and the spec are removed once the shim is past them.
            # A pane gone by now most likely ran a short agent to its end
            # (its exec was checked beforehand); its exit is recorded as usual.
            _wait_cmdline(self.pid, exec_done, timeout, None)
        finally:
            self._cleanup()

    def abort(self) -> None:
        """Close the window (its shim never ran anything) and remove the launch files."""
        try:
            self.server.kill_window(self.window)
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        for path in (self.fifo, self.spec):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


class TmuxServer:
    """The fleet's tmux server on its private socket; every method blocks (spawns tmux).

    Raises (from most methods):
        TmuxUnavailable: tmux or libtmux missing.
        TmuxError: a tmux command failed.
    """

    def __init__(self, fleet: str, directory: Path) -> None:
        self.fleet = fleet
        self.dir = directory
        self.socket = directory / "socket"
        self.config = directory / "tmux.conf"
        self.session = session_name(fleet)
        self._server: libtmux.Server | None = None
        self._prepared = False
        self._pid: int | None = None

    # -- availability -------------------------------------------------------

    def tmux_bin(self) -> str:
        found = shutil.which("tmux")
        if found is None:
            raise TmuxUnavailable(
                "tmux is not installed (or not on PATH); install it (apt install tmux) "
                "or launch without terminal='tmux'"
            )
        return found

    def prepare(self) -> None:
        """Check tmux and libtmux, make the private directory (0700) and the config.

        Done once per object: after that, what fails says so itself.
        """
        if self._prepared:
            return
        self.tmux_bin()
        _libtmux()
        if shutil.which("bash") is None:
            raise TmuxUnavailable("bash is not installed; tmux agents start through a bash shim")
        if len(os.fsencode(self.socket)) > _MAX_SOCKET_PATH:
            raise TmuxError(
                f"the tmux socket path {self.socket} is longer than {_MAX_SOCKET_PATH} bytes; "
                "use a shorter fleet name or tmux_dir"
            )
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = self.dir.stat()
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(f"{self.dir} is not a directory")
            (self.dir / "launch").mkdir(mode=0o700, exist_ok=True)
            probe = self.dir / f".probe-{os.getpid()}-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
            # exit-empty off: the server outlives its last session, so closing
            # the last agent's window does not end the server's scope.
            if not self.config.exists():
                self.config.write_text("set -s exit-empty off\n")
        except OSError as exc:
            raise TmuxError(
                f"cannot use {self.dir} for the fleet's tmux socket: {exc.strerror or exc}; "
                "make it writable for this user or pass another tmux_dir"
            ) from exc
        self._prepared = True

    def start_argv(self) -> list[str]:
        """The command that starts the server (run gated, in the server's scope)."""
        return [self.tmux_bin(), "-S", str(self.socket), "-f", str(self.config), "start-server"]

    # -- commands -----------------------------------------------------------

    def _lib(self) -> libtmux.Server:
        if self._server is None:
            lib = _libtmux()
            self._server = lib.Server(  # type: ignore[attr-defined]
                socket_path=str(self.socket), config_file=str(self.config)
            )
        assert self._server is not None
        return self._server

    def _cmd(self, *args: str, check: bool = True) -> list[str]:
        import libtmux.exc

        try:
            res = self._lib().cmd(*args)
        except libtmux.exc.TmuxCommandNotFound as exc:
            self.tmux_bin()  # raises the clear error
            raise TmuxUnavailable(f"tmux could not be run: {exc}") from exc
        if check and res.returncode != 0:
            raise TmuxError(
                f"tmux {args[0]} failed on {self.socket}: {' '.join(res.stderr) or 'no message'}"
            )
        return list(res.stdout) if res.returncode == 0 else []

    def alive(self) -> bool:
        """Whether the server runs on the fleet's socket (asked once, then its PID is watched)."""
        if not self.socket.exists():
            return False
        if self._pid is not None and _running(self._pid):
            return True
        return self.pid() is not None

    @property
    def known_pid(self) -> int | None:
        """The server's PID as last seen, without asking tmux (any thread; may be stale)."""
        return self._pid

    def pid(self) -> int | None:
        """The server's PID, None when it does not run."""
        self._pid = None
        if not self.socket.exists():
            return None
        out = self._cmd("display-message", "-p", "#{pid}", check=False)
        if out and _numbers.is_digits(out[0]) and len(out[0]) <= 10:
            self._pid = int(out[0])
        return self._pid

    def windows(self) -> list[Window] | None:
        """The windows of the fleet's session; None when the server does not answer."""
        if not self.socket.exists():
            return None
        res = self._lib().cmd("list-windows", "-t", f"={self.session}", "-F", _FORMAT)
        if res.returncode == 0:
            return parse_windows(res.stdout)
        if _no_session(res.stderr):
            return []  # the server runs; every window (so the session) has closed
        return None

    def window_of(self, pid: int) -> Window | None:
        """The window whose pane process is ``pid``."""
        for w in self.windows() or ():
            if w.pane_pid == pid:
                return w
        return None

    def open_pane(
        self,
        name: str,
        argv: Sequence[str],
        cwd: str,
        env: Mapping[str, str],
        oom_score_adj: int,
        tag: str,
    ) -> PaneLaunch:
        """A new window named ``name`` whose shim waits for :meth:`PaneLaunch.go`.

        Raises:
            WindowExists: a window of that name is open; nothing was created.
        """
        launch = self.dir / "launch"
        fifo, spec = launch / f"{tag}.fifo", launch / f"{tag}.spec"
        fd = -1
        try:
            fd_spec = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd_spec, "wb") as f:
                f.write(spec_bytes(oom_score_adj, cwd, env, argv))
            os.mkfifo(fifo, 0o600)
            # Held open read-write, so "go" can be written before the shim has
            # opened its end and stays in the pipe until it reads it.
            fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            # One tmux run per launch (each costs a process start): the new
            # window, then the listing that tells whether its name was taken.
            shim = ["bash", "-c", SHIM, SHIM_TAG, str(fifo), str(spec)]
            shim += [";", "list-windows", "-t", f"={self.session}", "-F", _FORMAT]
            common = ["-d", "-n", name, "-P", "-F", "#{window_id} #{pane_pid}"]
            res = self._lib().cmd("new-window", "-t", f"={self.session}:", *common, "--", *shim)
            if res.returncode != 0 and _no_session(res.stderr):
                res = self._lib().cmd("new-session", "-s", self.session, *common, "--", *shim)
                if res.returncode != 0 and any("duplicate session" in e for e in res.stderr):
                    # Another launch made the session in between.
                    res = self._lib().cmd(
                        "new-window", "-t", f"={self.session}:", *common, "--", *shim
                    )
            if res.returncode != 0 or not res.stdout:
                raise TmuxError(
                    f"tmux could not open a window for {name!r} on {self.socket}: "
                    f"{' '.join(res.stderr) or 'no message'}"
                )
            wid, _, pid = res.stdout[0].partition(" ")
            taken = [w for w in parse_windows(res.stdout[1:]) if w.name == name and w.id != wid]
            if taken:
                self.kill_window(wid)  # its shim never ran anything
                raise WindowExists(self.fleet, name, taken[0].id, self.socket)
            try:
                # Until then the pane's process is a fork of the tmux server.
                _wait_cmdline(int(pid), at_gate, 30, f"the tmux pane of {name!r} ended at once")
            except BaseException:
                self.kill_window(wid)
                raise
        except BaseException:
            if fd >= 0:
                os.close(fd)
            for path in (fifo, spec):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            raise
        return PaneLaunch(self, wid, int(pid), fifo, spec, fd)

    def kill_window(self, window: str) -> None:
        """Close a window (its processes get SIGHUP); a window already gone is fine."""
        self._cmd("kill-window", "-t", window, check=False)

    def capture(self, window: str, lines: int) -> list[str]:
        """The last ``lines`` lines of the window's pane (history included)."""
        out = self._cmd("capture-pane", "-p", "-J", "-t", window, "-S", f"-{max(lines, 0)}")
        return last_lines(out, lines)

    def send(self, window: str, text: str, enter: bool) -> None:
        """Type ``text`` into the window's pane (literally), then Enter if asked."""
        if text:
            self._cmd("send-keys", "-t", window, "-l", "--", text)
        if enter:
            self._cmd("send-keys", "-t", window, "Enter")

    def attach_argv(self, window: str, read_only: bool) -> list[str]:
        """The command that attaches a terminal to the window (``-r``: read-only)."""
        argv = [self.tmux_bin(), "-S", str(self.socket), "attach-session", "-t", window]
        return [*argv, "-r"] if read_only else argv


def not_a_tmux_agent(fleet: str, name: str) -> AgentscopeError:
    """The error for terminal operations on an agent that has no window."""
    return TmuxError(
        f"agent {name!r} of fleet {fleet!r} has no tmux window: it was launched without "
        "terminal='tmux', or its window was closed"
    )
