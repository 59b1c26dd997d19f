"""Decode with a filled cache, psa-edge against llama.cpp: docs/benchmarks.md's depth block.

Tokens/s after no context and after `depth` context tokens, and what each cached position adds
to a decoded token.

    .venv/bin/python tools/depth_bench.py --presets psa-30m psa-92m --depths 0 384

Decoding after `depth` context tokens, a step attends depth + i positions. Per preset and
precision, llama-bench (-d DEPTH) and `psa-edge bench --depth DEPTH` take turns on the builds of
tools/llama_cpp_bench.py (the twin's GGUF; PSA's fastest forms there: XNNPACK's runner form and
ONNX Runtime's fused form), at 1 thread. A token's cost per cached position is the slope of its
time between the shallowest and the deepest depth: attention's work per position (scores and
the weighted sum over every head), which the weights' work does not have.
"""

from __future__ import annotations

import argparse
import statistics

from common import MAX_LEN, artifact, commit, machine, psa_edge_json, write_block
from llama_cpp_bench import PRECISIONS, build_llama_cpp, gguf_builds, llama_bench

COLUMNS = {"xnnpack-runner": "ExecuTorch XNNPACK, runner form",
           "onnx-fused": "ONNX Runtime, fused form"}


def decode_rate(build, depth: int, args) -> float:
    report = psa_edge_json("bench", build, "-p", 1, "-n", args.n, "-r", args.r,
                           "--depth", depth, "--threads", 1)
    return report["results"][0][f"tg{args.n}"]["tokens_per_second"]


def measure(args) -> dict:
    """Median decode tokens/s over rounds: (preset, precision, engine, depth) -> t/s."""
    binaries = build_llama_cpp()
    args.p = 0  # llama-bench: decode only
    samples: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for preset in args.presets:
            ggufs = gguf_builds(preset, binaries)
            for precision in args.precisions:
                kind, builds = PRECISIONS[precision]
                for depth in args.depths:
                    rates = {"llama.cpp": llama_bench(binaries, ggufs[kind], 1, args,
                                                      depth)["tg"]}
                    for column in COLUMNS:
                        target, quant, form = builds[column]
                        rates[column] = decode_rate(artifact(preset, target, quant, False, form),
                                                    depth, args)
                    for engine, rate in rates.items():
                        samples.setdefault((preset, precision, engine, depth), []).append(rate)
                    print(preset, precision, depth, rates, flush=True)
    return {key: statistics.median(values) for key, values in samples.items()}


def table(rates: dict, args) -> str:
    shallow, deep = min(args.depths), max(args.depths)
    names = {"llama.cpp": "llama.cpp (twin)", **{c: f"{n} (PSA)" for c, n in COLUMNS.items()}}
    lines = [f"| preset | precision | engine | tg{args.n} t/s at depth {shallow} | tg{args.n} t/s "
             f"at depth {deep} | us per cached position |", "|" + "---|" * 6]
    for preset in args.presets:
        for precision in args.precisions:
            for engine, name in names.items():
                fast, slow = (rates[(preset, precision, engine, d)] for d in (shallow, deep))
                slope = (1 / slow - 1 / fast) * 1e6 / (deep - shallow)
                lines.append(f"| {preset} | {precision} / {PRECISIONS[precision][0]} | {name} | "
                             f"{fast:.0f} | {slow:.0f} | {slope:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-30m", "psa-92m"])
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS),
                        default=["int8", "int4"],
                        help="fp32's tokens are long enough to hide the slope in a VM's noise")
    parser.add_argument("--depths", nargs=2, type=int, default=[0, 384],
                        help=f"the shallow and the deep depth (deep + n <= {MAX_LEN})")
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("-r", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not 0 <= args.depths[0] < args.depths[1]:
        parser.error(f"--depths needs a shallow depth >= 0 below the deep one, got {args.depths}")
    rates = measure(args)
    block = (f"{machine()}, commit {commit()}, 1 thread; median of {args.rounds} rounds of "
             f"llama-bench -d DEPTH -n {args.n} -r {args.r} and `psa-edge bench --depth DEPTH "
             f"-n {args.n} -r {args.r}` taking turns, random weights, max length {MAX_LEN}. The "
             f"last column is the time each cached position adds to a decoded token, from the "
             f"two depths.\n\n"
             + table(rates, args) + "\n")
    write_block("depth", block, "docs/benchmarks.md")
    print(block)


if __name__ == "__main__":
    main()
