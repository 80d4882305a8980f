"""The one rule for splitting a ``/proc/PID/stat`` line (proc(5)); bytes in, no imports.

Here alone, apart from :mod:`._proc`'s readers, because ``agentscope exec``
reads a start time on its fast path, where no dataclass or pathlib is
imported (tests/test_cli.py::test_exec_fast_path_imports_only_what_it_needs).
"""

from __future__ import annotations

__all__ = ["split_stat"]


def split_stat(data: bytes) -> tuple[bytes, bytes, list[bytes]]:
    """``(pid, comm, fields)`` of a stat line; ``fields[0]`` is field 3 (state).

    The comm is whatever lies between the first ``(`` and the *last* ``)``:
    a process may name itself ``a) S 1 (b``, so the fields are split only
    after the last parenthesis (as psutil does). Field N is ``fields[N - 3]``
    (the start time, field 22, is ``fields[19]``).

    Raises:
        ValueError: the data is not a stat line.
    """
    head, sep, tail = data.rpartition(b")")
    pid_field, open_paren, comm = head.partition(b" (")
    fields = tail.split()
    if not sep or not open_paren or len(fields) < 20:
        raise ValueError(f"/proc/PID/stat: unexpected format {data[:120]!r}")
    return pid_field, comm, fields
