"""docs/benchmarks.md's prefill-since block: every benchmark build's prefill now against the
same build made and run by psa-edge as it was at a base commit (default 9389d90, the last one
before the static-cache decode work), the two taking turns.

    .venv/bin/python tools/prefill_since.py --presets psa-4m psa-30m --threads 1 2

The base's source is unpacked with `git archive` into out/base-REV/ (ignored, like all of
out/); its builds are exported and benchmarked by its own CLI, from that folder, from the same
random checkpoints as today's (`common.artifact`; XNNPACK's int4, which was one scale per row
at the base, from the "qc4w" grid's checkpoint, `common.snap_to_q4_grid`). At the base, ONNX
Runtime had the explicit-state form only and XNNPACK the explicit-state and runner forms; today
ONNX Runtime adds the fused form. Per round, each base build's `bench -p P -n 1 -r R` then each
of today's; the table reports the median prefill tokens/s over rounds, each backend's fastest
form today over its fastest at the base, and the lowest ratio of one form to itself. A form
that does not take a scheme (the fused form and static int8), or a base build its exporter
fails to make (the tool prints its error, and keeps it beside the builds as NAME.refused so
that a rerun does not export it again), is "-". "int4-g128" is today's int4 with
`--group-size 128` against the base's int4.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from common import (BENCH, MAX_LEN, OUT, REPO, artifact, bench_checkpoint, build_checkpoint,
                    commit, machine, page_with_block, psa_edge, psa_edge_json, quant_spec,
                    write_block)

from psa_edge.model import PRESETS

BASE = "9389d90"
PRECISIONS = ("fp32", "int8", "int8-dynamic", "int4", "int4-g128")
# backend -> (target, its forms at the base, its forms today)
BACKENDS = {"ONNX Runtime": ("onnx", ("explicit-state",), ("explicit-state", "fused")),
            "XNNPACK": ("xnnpack", ("explicit-state", "runner"), ("explicit-state", "runner"))}
TAKES_STATIC_INT8 = ("explicit-state", "runner")


def base_tree(rev: str) -> Path:
    """The base commit's source, unpacked once."""
    tree = OUT / f"base-{rev}"
    if not (tree / "psa_edge").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def base_cli(tree: Path) -> dict:
    """`common.psa_edge`'s arguments that run the base's psa-edge, from its own tree."""
    return {"cwd": tree, "env": {"PYTHONPATH": str(tree)}}


def base_artifact(tree: Path, rev: str, preset: str, target: str, quant: str | None,
                  form: str) -> Path | None:
    """The base's build of a benchmark build's checkpoint (XNNPACK int4: the base's grid's),
    exported once; None, with the base's last line of error printed, where it fails."""
    folder = BENCH / f"base-{rev}" / artifact(preset, target, quant, False, form).name
    # the base's refusal, kept: a rerun does not spend minutes exporting it to fail again
    refused = folder.with_name(folder.name + ".refused")
    if not (folder / "manifest.json").exists() and not refused.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        source = (bench_checkpoint(preset, "qc4w") if (target, quant) == ("xnnpack", "int4")
                  else build_checkpoint(preset, target, quant))
        export = psa_edge("export", source, "--target", target, "--form", form,
                          *(["--quantize", quant] if quant else []), "--max-seq-len", MAX_LEN,
                          "-o", folder, check=False, **base_cli(tree))
        if export.returncode:
            refused.write_text(export.stderr.strip().splitlines()[-1] + "\n")
    if refused.exists():
        print(f"{rev} does not export {folder.name}: {refused.read_text().strip()}", flush=True)
        return None
    return folder


def prefill_rate(report: dict, tokens: int) -> float:
    return report["results"][0][f"pp{tokens}"]["tokens_per_second"]


def builds(tree: Path, rev: str, preset: str, precision: str) -> dict:
    """(backend, "base" | "today", form) -> build folder, for the forms that take the scheme."""
    quant = None if precision == "fp32" else precision
    # the base had no --group-size: its build of a grouped scheme is the scheme's only build
    base_quant = quant and quant_spec(quant).scheme
    out = {}
    for backend, (target, base_forms, today_forms) in BACKENDS.items():
        for when, forms in (("base", base_forms), ("today", today_forms)):
            for form in forms:
                if precision == "int8" and form not in TAKES_STATIC_INT8:
                    continue
                out[backend, when, form] = (
                    base_artifact(tree, rev, preset, target, base_quant, form)
                    if when == "base" else artifact(preset, target, quant, False, form))
    return {key: folder for key, folder in out.items() if folder is not None}


def measure(args) -> list[dict]:
    """Every build exported (cached in out/bench/), then the rounds: per case, each build's
    prefill tokens/s, the base's builds timed by the base's CLI."""
    tree = base_tree(args.base)
    by_scheme = {(preset, precision): builds(tree, args.base, preset, precision)
                 for preset in args.presets for precision in args.precisions}
    cases = [(preset, precision, threads, by_scheme[preset, precision])
             for preset, precision in by_scheme for threads in args.threads]
    rounds = []
    for _ in range(args.rounds):
        for preset, precision, threads, folders in cases:
            row = {"preset": preset, "precision": precision, "threads": threads,
                   "base": args.base, "commit": commit(), "machine": machine(),
                   "tokens": args.p, "reps": args.r, "pp": {}}
            for (backend, when, form), folder in folders.items():
                report = psa_edge_json("bench", folder, "-p", args.p, "-n", 1, "-r", args.r,
                                       "--threads", threads,
                                       **(base_cli(tree) if when == "base" else {}))
                row["pp"][f"{backend}|{when}|{form}"] = prefill_rate(report, args.p)
            rounds.append(row)
            print(json.dumps(row), flush=True)
    return rounds


def table(rounds: list[dict]) -> str:
    """Median prefill tokens/s per build, and per backend today's best form over the base's
    best and the lowest ratio of a form to itself."""
    lines = ["| preset | precision | threads | backend | base: explicit-state / runner | "
             "today: explicit-state / runner or fused | today's best / base's best | "
             "lowest same-form ratio |", "|" + "---|" * 8]
    cases = sorted({(r["preset"], r["precision"], r["threads"]) for r in rounds},
                   key=lambda k: (list(PRESETS).index(k[0]), PRECISIONS.index(k[1]), k[2]))
    for preset, precision, threads in cases:
        runs = [r for r in rounds if (r["preset"], r["precision"], r["threads"])
                == (preset, precision, threads)]
        med = {key: statistics.median(r["pp"][key] for r in runs) for key in runs[0]["pp"]}
        for backend, (_, _, today_forms) in BACKENDS.items():
            rate = {tuple(k.split("|")[1:]): v for k, v in med.items()
                    if k.startswith(backend + "|")}
            cells = [" / ".join(f"{rate[when, f]:.0f}" if (when, f) in rate else "-"
                                for f in forms)
                     for when, forms in (("base", ("explicit-state", "runner")),
                                         ("today", today_forms))]
            base = [v for (w, _), v in rate.items() if w == "base"]
            if not base:  # the base exported no form of it (printed while measuring)
                lines.append(f"| {preset} | {precision} | {threads} | {backend} | none | "
                             f"{cells[1]} | - | - |")
                continue
            today = max(v for (w, _), v in rate.items() if w == "today")
            same = min(rate["today", f] / rate["base", f] for (w, f) in rate
                       if w == "base" and ("today", f) in rate)
            lines.append(f"| {preset} | {precision} | {threads} | {backend} | {cells[0]} | "
                         f"{cells[1]} | **{today / max(base):.2f}** | {same:.2f} |")
    return "\n".join(lines)


def rates_by_build(rounds: list[dict]) -> dict[tuple, list[float]]:
    """(preset, precision, threads, build) -> its prefill tokens/s in each round."""
    out = {}
    for r in rounds:
        for key, rate in r["pp"].items():
            out.setdefault((r["preset"], r["precision"], r["threads"], key), []).append(rate)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help="the commit to measure against")
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m"])
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-r", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--render", action="store_true", help="the page from the last results")
    args = parser.parse_args()
    page_with_block("prefill-since", "docs/benchmarks.md")  # before the hour of measuring
    results = BENCH / "prefill-since.json"
    rounds = json.loads(results.read_text()) if results.exists() else []
    if not args.render:  # other presets' and precisions' rows, same base and machine, are kept
        kept = [r for r in rounds if r["base"] == args.base and r["machine"] == machine()
                and (r["preset"] not in args.presets or r["precision"] not in args.precisions)]
        rounds = kept + measure(args)
        results.write_text(json.dumps(rounds, indent=1))
    if not rounds:
        raise SystemExit(f"{results} holds no results: run without --render first")
    tokens, reps = rounds[-1]["tokens"], rounds[-1]["reps"]
    by_build = rates_by_build(rounds)
    done = min(map(len, by_build.values()))
    spread = max(max(values) / min(values) for values in by_build.values())
    today = ", ".join(dict.fromkeys(r["commit"] for r in rounds))
    block = (f"{rounds[0]['machine']}; base {rounds[0]['base']}, today {today}. "
             f"Prefill of {tokens} tokens from an empty cache (`psa-edge bench -p {tokens} -n 1 "
             f"-r {reps}`, each commit's own CLI), tokens/s, median of {done} rounds taking "
             f"turns; random weights, PSA key-only 0.8, max length {MAX_LEN}. The widest spread "
             f"of one build's rounds (fastest / slowest): {spread:.2f}.\n\n"
             + table(rounds) + "\n")
    write_block("prefill-since", block, "docs/benchmarks.md")
    print(block)


if __name__ == "__main__":
    main()
