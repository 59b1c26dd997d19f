"""docs/xnnpack-profile.md: where an ExecuTorch XNNPACK decode step spends its time, PSA against
its gamma = 0 twin, by function, from Linux perf's CPU samples.

    python tools/xnnpack_perf.py    # about 4 minutes; needs `perf` (linux-tools) and root or
                                    # kernel.perf_event_paranoid <= 1; reuses (or exports) the
                                    # artifacts of tools/bench_presets.py in out/bench/

ExecuTorch's own profiler (ETDump, time per instruction) needs a runtime built with its event
tracer, which the executorch wheel is not, so this samples the process instead. Per preset and
XNNPACK build, in this process: the backend call of method `decode` on prebuilt inputs at a fixed
context (decode_profile.py's first layer), PSA and twin alternating in blocks of about 4 ms
(A B / B A), in rounds that each open both programs afresh, while `perf record` samples the
process with CLOCK_MONOTONIC timestamps. Each sample is assigned by its timestamp to the block
it fell in, so both sides share the machine's slow spells, and samples between blocks are
dropped. In a round, a function's time per call is its share of a side's samples times that
side's measured time per call; differences are averaged over rounds, with a 95% interval.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_presets import (artifact, checkpoint, cpu_times, ratio_text,  # noqa: E402
                           steal_sentence, steal_share)
from decode_profile import BLOCK_SECONDS, LAYERS, layer_calls, task_context  # noqa: E402
from psa_edge.io import write_text  # noqa: E402
from psa_edge.runtime.bench import machine, mean_ci, set_threads  # noqa: E402

SIDES = ("psa", "twin")
# Where a sampled function belongs, tried in order on "symbol (library)".
CATEGORIES = (
    ("XNNPACK's per-call work around its kernels (reshape, setup, arguments, threadpool)",
     re.compile(r"xnn_(reshape|setup|create|shape|normalize)|XNNExecutor|XnnpackBackend"
                r"|pthreadpool")),
    ("XNNPACK kernels, named", re.compile(r"^xnn_")),
    ("unnamed (stripped) code in ExecuTorch's library, XNNPACK's microkernels among it",
     re.compile(r"^\[unknown\] \(_portable_lib")),
    ("ExecuTorch runtime and portable ops", re.compile(r"executorch::|torch::executor::")),
    ("memory copies (libc)", re.compile(r"^__mem(move|cpy|set)")),
    ("allocation (libc)", re.compile(r"(malloc|free|_int_|consolidate).*\(libc")),
    ("PyTorch (the pybindings' torch tensors)", re.compile(r"\((libtorch|libc10)")),
    ("Python interpreter", re.compile(r"\(libpython")),
    ("kernel", re.compile(r"\[kernel")),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m"])
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=16, help="Fresh sessions per build.")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="Sampled seconds of decode calls per side and round.")
    parser.add_argument("--frequency", type=int, default=4999, help="perf samples per second.")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the intervals are over rounds")
    if shutil.which("perf") is None:
        sys.exit("xnnpack_perf: needs Linux perf (`perf` on PATH, package linux-tools)")
    started, cpu_before = time.time(), cpu_times()
    results = []
    for preset in args.presets:
        ckpt = checkpoint(preset)
        context = task_context(ckpt, args.context)
        for quant in (None, "int8"):
            paths = {who: artifact(ckpt, "xnnpack", quant, who == "twin") for who in SIDES}
            set_threads(list(paths.values()), 1)
            rounds = sampled_rounds(paths, context, args)
            results.append((preset, quant or "fp32", rounds))
            psa, twin = (statistics.median(r[who]["per_call"] for r in rounds) for who in SIDES)
            print(f"{preset} xnnpack {quant or 'fp32'}: {psa * 1e6:.1f} / {twin * 1e6:.1f} µs "
                  f"per call", flush=True)
    write(results, args, (time.time() - started, steal_share(cpu_before, cpu_times())))


def sampled_rounds(paths: dict[str, Path], context, args) -> list[dict]:
    """Per round (fresh sessions, opened PSA first in even rounds): per side, seconds per call
    and samples per function, from one perf record of this process while the sides' calls
    alternate in blocks."""
    blocks: list[tuple[float, float, int, str]] = []
    spent, done = Counter(), Counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F",
                                 str(args.frequency), "-p", str(os.getpid()), "-o", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf attaches asynchronously
        for n in range(args.rounds):
            order = SIDES if n % 2 == 0 else SIDES[::-1]
            calls = {who: layer_calls(paths[who], context)[0][LAYERS[0]][0] for who in order}
            per_block = {who: max(1, round(BLOCK_SECONDS / warm_seconds(call)))
                         for who, call in calls.items()}
            index = 0
            while min(spent[n, who] for who in SIDES) < args.seconds:
                for who in (SIDES if index % 2 == 0 else SIDES[::-1]):
                    start = time.monotonic()
                    for _ in range(per_block[who]):
                        calls[who]()
                    end = time.monotonic()
                    blocks.append((start, end, n, who))
                    spent[n, who] += end - start
                    done[n, who] += per_block[who]
                index += 1
        perf.send_signal(signal.SIGINT)  # perf record writes its data and ends on SIGINT
        perf.wait(timeout=60)
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "time,ip,sym,dso"],
                                capture_output=True, text=True).stdout
    sampled = assign(script, blocks)
    if not all(sampled[key] for key in done):
        sys.exit("xnnpack_perf: perf recorded no samples of this process; it needs root or "
                 "kernel.perf_event_paranoid <= 1")
    return [{who: {"per_call": spent[n, who] / done[n, who], "calls": done[n, who],
                   "functions": sampled[n, who]} for who in SIDES} for n in range(args.rounds)]


def warm_seconds(call) -> float:
    """Seconds per call after a warm-up (the first calls of a fresh program are slower)."""
    for _ in range(20):
        call()
    begin = time.perf_counter()
    for _ in range(20):
        call()
    return (time.perf_counter() - begin) / 20


def assign(script: str, blocks: list[tuple[float, float, int, str]]) -> dict[tuple, Counter]:
    """Samples per function of each (round, side), from `perf script` lines
    "time: ip symbol (library)"; samples outside every block are dropped."""
    starts = [block[0] for block in blocks]
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for line in script.splitlines():
        stamp, _, rest = line.partition(":")
        try:
            at = float(stamp)
        except ValueError:
            continue
        i = bisect.bisect_right(starts, at) - 1
        if i < 0 or at > blocks[i][1]:
            continue
        ip_and_function = rest.strip().split(" ", 1)
        counts[blocks[i][2:]][function_name(ip_and_function[-1])] += 1
    return counts


def function_name(symbol_and_library: str) -> str:
    """"symbol (library basename)"; C++ argument lists and template arguments dropped."""
    symbol, _, library = symbol_and_library.rpartition(" (")
    symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
    while re.search(r"<[^<>]*>", symbol):
        symbol = re.sub(r"<[^<>]*>", "", symbol)
    symbol = re.sub(r"\(.*\)", "", symbol)
    return f"{symbol} ({Path(library.rstrip(')')).name})"


def category(function: str) -> str:
    return next((name for name, pattern in CATEGORIES if pattern.search(function)), "other")


def per_call_us(side: dict, key, of=lambda f: f) -> float:
    """Microseconds per call of the functions that `of` maps to `key`, on one side of a round:
    their share of its samples times its measured time per call."""
    functions = side["functions"]
    share = sum(n for f, n in functions.items() if of(f) == key) / sum(functions.values())
    return share * side["per_call"] * 1e6


def difference_rows(rounds: list[dict], keys, of=lambda f: f) -> list[tuple]:
    """Per key: PSA's and the twin's microseconds per call (means over rounds) and the mean of
    the rounds' differences with its 95% half width."""
    rows = []
    for key in keys:
        psa, twin = ([per_call_us(r[who], key, of) for r in rounds] for who in SIDES)
        rows.append((key, statistics.fmean(psa), statistics.fmean(twin),
                     *mean_ci([a - b for a, b in zip(psa, twin)])))
    return rows


def table(rows: list[tuple], label: str) -> str:
    lines = [f"| {label} | PSA µs per call | twin µs per call | PSA - twin (µs) [95% CI] |",
             "|---|---|---|---|"]
    lines += [f"| {key} | {psa:.1f} | {twin:.1f} | {diff:+.1f} [{diff - half:+.1f}, "
              f"{diff + half:+.1f}] |" for key, psa, twin, diff, half in rows]
    return "\n".join(lines)


def build_section(preset: str, precision: str, rounds: list[dict], top: int) -> str:
    functions = {f for r in rounds for who in SIDES for f in r[who]["functions"]}
    categories = {category(f) for f in functions}
    by_category = sorted(difference_rows(rounds, categories, category), key=lambda r: -r[1])
    by_function = sorted(difference_rows(rounds, functions), key=lambda r: -abs(r[3]))[:top]
    psa, twin = ([r[who]["per_call"] for r in rounds] for who in SIDES)
    total, half = mean_ci([(a - b) * 1e6 for a, b in zip(psa, twin)])
    above = [f"{key} {diff:+.1f} µs" for key, _, _, diff, h in by_category if diff - h > 0]
    samples = {who: sum(sum(r[who]["functions"].values()) for r in rounds) for who in SIDES}
    calls = {who: sum(r[who]["calls"] for r in rounds) for who in SIDES}
    return f"""
## {preset} XNNPACK {precision}

Backend call of `decode`, median over rounds: PSA {statistics.median(psa) * 1e6:.1f} µs, twin
{statistics.median(twin) * 1e6:.1f} µs per call; PSA / twin {ratio_text([a / b for a, b in
zip(psa, twin)])} (geometric mean of the rounds' ratios). {calls['psa']} and {calls['twin']}
calls, {samples['psa']} and {samples['twin']} samples.

{table(by_category, "where")}

PSA - twin per call: {total:+.1f} µs [{total - half:+.1f}, {total + half:+.1f}]; where the 95%
interval is above zero: {"; ".join(above) or "nowhere"}.

The {top} functions whose time differs most between PSA and twin:

{table(by_function, "function (library)")}
"""


def write(results: list, args, run) -> None:
    (wall, steal), m = run, machine()
    doc = f"""# Where an XNNPACK decode step spends its time, by function

Made by `python tools/xnnpack_perf.py --context {args.context} --rounds {args.rounds} \
--seconds {args.seconds:g} --frequency {args.frequency}` in {wall / 60:.0f} min on {m['cpu']}
({m['cores']} cores, {m['arch']}; {steal_sentence(steal)}), one thread, with the artifacts of
[benchmarks.md](benchmarks.md) (random weights, key-only gamma_k 0.8). ExecuTorch's ETDump needs
a runtime built with its event tracer, which the executorch wheel is not, so this samples the
process with Linux perf instead. What is timed is the backend call of method `decode` on
prebuilt inputs at a fixed context of {args.context} tokens (the first layer of
[decode-profile.md](decode-profile.md)). Each of {args.rounds} rounds opens both programs afresh
(PSA first in even rounds) and alternates PSA and twin in blocks of about
{BLOCK_SECONDS * 1e3:.0f} ms until each has run {args.seconds:g} s, while perf samples the
process {args.frequency} times a second; each sample is assigned to the block it fell in. In a
round, a function's time per call is its share of its side's samples times that side's measured
time per call; the tables give the means over rounds and the mean of the rounds' differences
with its 95% confidence interval. ExecuTorch's library is stripped of its internal symbols, so
its unnamed code is one row ("[unknown]"); XNNPACK's microkernels are among it.
"""
    doc += "".join(build_section(preset, precision, rounds, top=12)
                   for preset, precision, rounds in results)
    write_text(REPO / "docs" / "xnnpack-profile.md", doc)
    print(doc)


if __name__ == "__main__":
    main()
