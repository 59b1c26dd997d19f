"""docs/results/benchmarks.md's raw-key block: what the raw-key form (plain Llama's I/O, the
graph shearing every cached raw key on every call) costs per decoded token against the
explicit-state form (a previous-key slot beside the cache, the shear of the new token only) of
the same PSA model, at 128, 512 and 2,048 cached positions; ONNX Runtime fp32, one thread.

    .venv/bin/python tools/raw_key_cost.py --preset psa-30m -r 10 --rounds 2   # ~10 min, 2 cores

Random weights (`common.random_checkpoint`, key-only 0.8), both forms exported at max length
2,048 + 64. Each depth runs `bench RAW --vs SLOT` and `bench SLOT --vs RAW` (interleaved, opened
afresh every repetition) in `--rounds` processes each; the decode p50 ratio has a 95% interval
over every repetition. Artifacts and raw JSON go to out/bench/.
"""

from __future__ import annotations

import argparse
import json

from common import BENCH, commit, export_once, machine, psa_edge_json, random_checkpoint, \
    write_block

from psa_edge.runtime.bench import geomean_ci

DEPTHS = (128, 512, 2048)
GEN = 32
PAGE = "docs/results/benchmarks.md"


def decode_ratios(a, b, depth: int, args) -> tuple[list[float], dict]:
    """Per-repetition decode p50 ratios a / b at `depth` over both orders, and one report."""
    ratios, first = [], None
    for _ in range(args.rounds):
        for x, y, sign in ((a, b, 1), (b, a, -1)):
            report = psa_edge_json("bench", x, "--vs", y, "-p", 16, "-n", GEN, "-r", args.r,
                                   "--depth", depth, "--threads", 1)
            first = first or report
            per_rep = report["ratio_psa_over_twin"][f"tg{GEN}_latency_p50"]["per_rep"]
            ratios += [r ** sign for r in per_rep]
    return ratios, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="psa-30m")
    parser.add_argument("-r", type=int, default=10, help="repetitions per bench")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    checkpoint = random_checkpoint(args.preset, BENCH / f"{args.preset}-raw-key-cost.pt")
    length = max(DEPTHS) + 2 * GEN
    raw, slot = (export_once(checkpoint, BENCH / f"{args.preset}-onnx-{form}-{length}", "onnx",
                             form=form, max_seq_len=length)
                 for form in ("raw-key", "explicit-state"))
    rows, reports = [], {}
    for depth in DEPTHS:
        ratios, report = decode_ratios(raw, slot, depth, args)
        summary = geomean_ci(ratios)
        low, high = summary["ci95"]
        tg = [r[f"tg{GEN}"]["tokens_per_second"] for r in report["results"]]
        rows.append(f"| {depth:,} | {tg[0]:.0f} | {tg[1]:.0f} | {summary['geomean']:.3f} "
                    f"[{low:.3f}, {high:.3f}] |")
        reports[depth] = {"ratios": ratios, "report": report}
    (BENCH / f"raw-key-cost-{args.preset}.json").write_text(json.dumps(reports, indent=1))
    write_block("raw-key", "\n".join([
        f"{args.preset}, random weights, key-only 0.8, ONNX Runtime fp32, 1 thread, decode of "
        f"{GEN} tokens after the cached context; {machine()}; commit {commit()}; "
        f"`tools/raw_key_cost.py -r {args.r} --rounds {args.rounds}`.", "",
        "| cached positions | raw-key tok/s | explicit-state tok/s | raw-key / explicit-state "
        "time per token, p50 [95% CI] |", "|---|---|---|---|", *rows]), PAGE)


if __name__ == "__main__":
    main()
