"""Start-up cost of agentscope-generator, which runs early in every boot and daemon-reload.

Times ``python3 -I generator.py OUT OUT OUT`` (with a config file, so tomllib
is imported, and without one) against a bare ``python3 -I -c pass``,
alternating the three so drift on a shared machine hits all alike, and
prints the median of each and the differences: what the generator itself
costs on top of starting Python. The budget is 50 ms (natively).

Run: ``.venv/bin/python benchmarks/bench_generator.py [--runs 50] [--python /usr/bin/python3]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GENERATOR = Path(__file__).resolve().parent.parent / "agentscope_systemd" / "generator.py"
CONFIG = """\
[slice]
oomd_pressure_limit = "80%"

[monitor]
exec = "/usr/local/bin/agentscope"
watchdog_sec = 30

[[fleet]]
name = "default"

[[fleet]]
name = "ci"
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run, which must succeed."""
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--python", default=sys.executable, help="the interpreter to time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "agentscope.toml"
        config.write_text(CONFIG)
        out = Path(tmp) / "out"
        base_env = {"PATH": os.environ.get("PATH", ""), "SYSTEMD_LOG_TARGET": "console"}
        cases = {
            "python -I -c pass": ([args.python, "-I", "-c", "pass"], base_env),
            "generator, no config": (
                [args.python, "-I", str(GENERATOR), str(out), str(out), str(out)],
                {**base_env, "AGENTSCOPE_CONFIG": str(Path(tmp) / "missing.toml")},
            ),
            "generator, config": (
                [args.python, "-I", str(GENERATOR), str(out), str(out), str(out)],
                {**base_env, "AGENTSCOPE_CONFIG": str(config)},
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for argv, env in cases.values():  # warm the page cache
            timed(argv, env)
        for _ in range(args.runs):
            for name, (argv, env) in cases.items():
                shutil.rmtree(out, ignore_errors=True)
                times[name].append(timed(argv, env))
    medians = {name: statistics.median(t) for name, t in times.items()}
    bare = medians["python -I -c pass"]
    print(f"{args.python}, median of {args.runs} runs each:")
    for name, median in medians.items():
        extra = "" if median is bare else f"  (+{(median - bare) * 1e3:6.2f} ms over bare Python)"
        print(f"  {name:<22} {median * 1e3:7.2f} ms{extra}")


if __name__ == "__main__":
    main()
