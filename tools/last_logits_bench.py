"""docs/benchmarks.md's last-logits block: a prefill of the fused ONNX form computing the
logits of every row against the last row's only (its `logits_to_keep` input, which `generate`,
`bench` and a speculative target's prefill use), beside llama.cpp's prefill of the twin
(llama-bench's pp, which computes the last row's logits only).

    .venv/bin/python tools/last_logits_bench.py --presets psa-4m psa-30m psa-92m --threads 1 2

The builds and GGUFs are `tools/llama_cpp_bench.py`'s (the fused column: random weights, PSA
key-only 0.8; llama.cpp built once, outside the repository). Per round and case, llama-bench
(-p, -r) runs, then one session of the fused build prefills the same number of tokens both ways,
taking turns (the order flipped every repetition), -r times each after one warm-up of each. The
table reports medians over rounds of each round's median; speed-up is the all-rows time over the
last-row time. A second table splits a last-row prefill at 1 thread by ONNX Runtime's profiler
(`psa-edge bench --profile`, -r prefills, each round after the timed ones) and sets its weight
MatMul kernels' time against the same round's llama.cpp prefill: at or near 1, those kernels
alone leave the form no way to match it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace

import numpy as np
from common import artifact, commit, machine, page_with_block, psa_edge_json, write_block
from llama_cpp_bench import (FOLDER, LINEAR_OPS, PRECISIONS, build_llama_cpp, gguf_builds,
                             llama_bench)

from psa_edge.runtime.session import open_session


def prefill_seconds(build, threads: int, tokens: int, reps: int) -> dict[str, float]:
    """Median seconds of a prefill of `tokens` tokens with every row's logits ("all") and with
    the last row's only ("last"), the two taking turns in one session."""
    session = open_session(build, threads)
    prompt = np.random.default_rng(0).integers(0, session.io.vocab_size, size=tokens)
    times = {"all": [], "last": []}
    for rep in range(reps + 1):
        for kind in ("all", "last") if rep % 2 == 0 else ("last", "all"):
            session.reset()
            started = time.perf_counter()
            logits = session.feed(prompt, last_only=kind == "last")
            elapsed = time.perf_counter() - started
            if rep:  # the first of each is the warm-up
                times[kind].append(elapsed)
            assert logits.shape[0] == (1 if kind == "last" else tokens)
    return {kind: statistics.median(values) for kind, values in times.items()}


def measure(args) -> list[dict]:
    binaries = build_llama_cpp()
    FOLDER.mkdir(parents=True, exist_ok=True)
    llama_args = SimpleNamespace(p=args.p, n=0, r=args.r)
    cases = []
    for preset in args.presets:
        ggufs = gguf_builds(preset, binaries)
        for precision in args.precisions:
            kind, builds = PRECISIONS[precision]
            target, quant, form = builds["onnx-fused"]
            build = artifact(preset, target, quant, False, form)
            cases += [(preset, precision, kind, threads, ggufs[kind], build)
                      for threads in args.threads]
    rounds = []
    for round_ in range(args.rounds):
        for preset, precision, kind, threads, gguf_path, build in cases:
            llama = llama_bench(binaries, gguf_path, threads, llama_args)
            ours = prefill_seconds(build, threads, args.p, args.r)
            if threads == 1:
                ours["profile"] = psa_edge_json("bench", build, "--profile", "-p", args.p,
                                                "-n", 1, "-r", args.r, "--threads", 1)["prefill"]
            rounds.append({"preset": preset, "precision": precision, "kind": kind,
                           "threads": threads, "llama_pp": llama["pp"],
                           "llama_build": llama["build"], **ours})
            print(json.dumps(rounds[-1]), flush=True)
    return rounds


def table(rounds: list[dict], args) -> str:
    lines = [f"| preset | precision | threads | llama.cpp pp{args.p} (twin), t/s | fused form, "
             f"every row's logits, t/s | the same, the last row's, t/s | speed-up | last row / "
             f"llama.cpp |", "|" + "---|" * 8]
    cases = dict.fromkeys((r["preset"], r["precision"], r["kind"], r["threads"]) for r in rounds)
    for preset, precision, kind, threads in cases:
        runs = [r for r in rounds if (r["preset"], r["precision"], r["threads"])
                == (preset, precision, threads)]
        llama = statistics.median(r["llama_pp"] for r in runs)
        every, last = (statistics.median(r[k] for r in runs) for k in ("all", "last"))
        lines.append(f"| {preset} | {precision} / {kind} | {threads} | {llama:.0f} | "
                     f"{args.p / every:.0f} | {args.p / last:.0f} | {every / last:.2f} | "
                     f"**{args.p / last / llama:.2f}** |")
    return "\n".join(lines)


def profiles(rounds: list[dict], args) -> str:
    """Where a last-row prefill's time goes at 1 thread (`psa-edge bench --profile`, whose
    profiler adds its own cost to every node), beside llama.cpp's whole prefill, in ms: medians
    over rounds, the last column the median of each round's ratio."""
    lines = [f"| preset | precision | llama.cpp pp{args.p} | psa-edge prefill, last row: "
             f"unprofiled / profiled | weight MatMuls | GroupQueryAttention | other operators "
             f"| outside ONNX Runtime | weight MatMuls / llama.cpp |", "|" + "---|" * 9]
    cases = dict.fromkeys((r["preset"], r["precision"], r["kind"]) for r in rounds
                          if r["threads"] == 1)
    for preset, precision, kind in cases:
        parts = []
        for r in rounds:
            if (r["preset"], r["precision"], r["threads"]) != (preset, precision, 1):
                continue
            ops = r["profile"]["kernel_us_per_prefill"]
            weights = sum(ops.get(op, 0) for op in LINEAR_OPS) / 1e3
            attention = ops.get("GroupQueryAttention", 0) / 1e3
            llama = 1e3 * args.p / r["llama_pp"]
            parts.append((llama, 1e3 * r["last"], r["profile"]["wall_us_per_prefill"] / 1e3,
                          weights, attention, sum(ops.values()) / 1e3 - weights - attention,
                          r["profile"]["outside_ort_us_per_prefill"] / 1e3, weights / llama))
        medians = [statistics.median(column) for column in zip(*parts)]
        lines.append(f"| {preset} | {precision} / {kind} | {medians[0]:.2f} | {medians[1]:.2f} "
                     f"/ {medians[2]:.2f} | " + " | ".join(f"{m:.2f}" for m in medians[3:7])
                     + f" | **{medians[7]:.2f}** |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m", "psa-92m"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS),
                        default=list(PRECISIONS))
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-r", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    page_with_block("last-logits", "docs/benchmarks.md")  # before, not after, the measurement
    rounds = measure(args)
    block = (f"{machine()}, commit {commit()}; llama.cpp {rounds[0]['llama_build']}. Prefill "
             f"of {args.p} tokens from an empty cache, tokens/s from the median of {args.rounds} "
             f"rounds, each of llama-bench -p {args.p} -r {args.r} and then {args.r} prefills "
             f"of each kind taking turns in one psa-edge session.\n\n" + table(rounds, args))
    if 1 in args.threads:
        block += (f"\n\nWhere a last-row prefill's time goes, 1 thread, -p {args.p}, a mean "
                  f"of {args.r} in each round, medians over rounds (milliseconds per prefill; "
                  f"the operator columns are ONNX Runtime's profile, whose own cost per node "
                  f"inflates the small operators most, `psa-edge bench --profile`):\n\n"
                  + profiles(rounds, args))
    write_block("last-logits", block, "docs/benchmarks.md")
    print(block)


if __name__ == "__main__":
    main()
