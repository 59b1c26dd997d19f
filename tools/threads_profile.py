"""Decode at 1 and 2 threads, and how often the threadpool's worker sleeps: docs/runtime.md's
threads block.

    .venv/bin/python tools/threads_profile.py --processes 5   # ~7 min on 2 cores

The int4 runner-form builds of docs/benchmarks.md (XNNPACK, PSA and its gamma = 0 twin) decode
128 tokens from an empty cache, over and over for `--seconds`, in fresh processes at 1 and at 2
threads, the settings taking turns (`--processes` each). Each process reads from
/proc/self/task, before and after, every thread's voluntary context switches (how often it
went to sleep) and CPU time. At 2 threads ExecuTorch's threadpool (torch's pthreadpool) has one
worker beside the calling thread; a worker that finds no work spins for a fixed count of
iterations and then sleeps in the kernel, so each sleep costs the next parallel operator a
wake-up. The block gives the median process's microseconds per step, the worker's sleeps per
step and the share of the time it was on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import MAX_LEN, artifact, commit, machine, write_block

PRESETS = ("psa-4m", "psa-30m")


def thread_counters() -> dict[int, tuple[int, int]]:
    """Per thread of this process: (voluntary context switches, CPU nanoseconds)."""
    counters = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            status = Path(f"/proc/self/task/{tid}/status").read_text()
            cpu_ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except OSError:  # the thread ended
            continue
        sleeps = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        counters[int(tid)] = (sleeps, cpu_ns)
    return counters


def child(build: Path, threads: int, seconds: float) -> None:
    """Runs in its own process: decode for `seconds`, print the counters' JSON."""
    import numpy as np

    from psa_edge.runtime.bench import Runner

    runner = Runner(build, threads)
    context, tokens = np.zeros(0, np.int64), np.arange(128) * 7 % 1000
    runner.warm_up(context, tokens, tokens)
    before, started, decoding, steps = thread_counters(), time.perf_counter(), 0.0, 0
    while time.perf_counter() - started < seconds:
        decoding += sum(runner.decode(context, tokens))
        steps += tokens.size
    wall, after = time.perf_counter() - started, thread_counters()
    main = threading.get_native_id()
    workers = [(after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in after
               if t != main and t in before and after[t][1] - before[t][1] > 0.01 * wall * 1e9]
    print(json.dumps({"us_per_step": 1e6 * decoding / steps,
                      "worker_sleeps_per_step": sum(w[0] for w in workers) / steps,
                      "worker_cpu_share": sum(w[1] for w in workers) / (wall * 1e9)}))


def measure(build: Path, threads: int, seconds: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(build), str(threads),
                          str(seconds)], capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def rows(args) -> list[str]:
    lines = []
    for preset in PRESETS:
        for twin in (False, True):
            build = artifact(preset, "xnnpack", "int4", twin, "runner")
            runs = {1: [], 2: []}
            for i in range(args.processes):
                for threads in ((1, 2) if i % 2 == 0 else (2, 1)):
                    runs[threads].append(measure(build, threads, args.seconds))
            median = lambda threads, key: statistics.median(r[key] for r in runs[threads])  # noqa
            one, two = median(1, "us_per_step"), median(2, "us_per_step")
            lines.append(f"| {preset} | {'twin' if twin else 'PSA'} | {one:.0f} | {two:.0f} | "
                         f"**{two / one:.2f}** | {median(2, 'worker_sleeps_per_step'):.2f} | "
                         f"{100 * median(2, 'worker_cpu_share'):.0f}% |")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3, help="Processes per setting.")
    parser.add_argument("--seconds", type=float, default=4.0, help="Decoding per process.")
    parser.add_argument("--child", nargs=3, metavar=("BUILD", "THREADS", "SECONDS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(Path(args.child[0]), int(args.child[1]), float(args.child[2]))
    if args.processes < 1 or args.seconds <= 0:
        parser.error("--processes must be at least 1 and --seconds above 0")
    header = ["| preset | build | us per step, 1 thread | the same, 2 threads | 2 / 1 | worker "
              "sleeps per step (2 threads) | worker on a CPU (2 threads) |",
              "|---|---|---|---|---|---|---|"]
    write_block("threads", f"{machine()}, commit {commit()}, XNNPACK runner form, int4, max "
                f"length {MAX_LEN}: 128 decode steps from an empty cache, repeated for "
                f"{args.seconds:g} s, median of {args.processes} fresh processes per setting, "
                "the settings taking turns.\n\n" + "\n".join(header + rows(args)),
                "docs/runtime.md")


if __name__ == "__main__":
    main()
