"""docs/results/benchmarks.md's presets block and the overview's bench block (blocks only: the prose
around them belongs to the page): prefill and decode speed of psa-4m and
psa-30m, ONNX Runtime and ExecuTorch XNNPACK, fp32 and int8, PSA (key-only 0.8) against its
gamma = 0 twin, interleaved by `psa-edge bench --vs`; `--exports`: docs/results/export-sizes.md;
`--memory`: docs/results/benchmarks.md's memory block (peak RSS, fused against explicit-state);
`--fused` / `--runner`: the PSA / twin blocks of ONNX Runtime's fused form and of XNNPACK's
runner form; at more than one thread, their own blocks (`fused-2-threads`, `runner-2-threads`).

    .venv/bin/python tools/bench_presets.py --threads 1 -r 20 --rounds 2   # 27-81 min on 2 cores
    .venv/bin/python tools/bench_presets.py --exports --presets tiny psa-4m psa-30m
    .venv/bin/python tools/bench_presets.py --memory --threads 1 --rounds 2 \
        --presets psa-4m psa-30m psa-92m
    .venv/bin/python tools/bench_presets.py --runner --threads 1 -r 10 --presets psa-30m psa-92m
    .venv/bin/python tools/bench_presets.py --fused --threads 2 -r 10 --presets psa-30m psa-92m

Random weights (`common.random_checkpoint`). Each pair runs `bench A --vs B` and `bench B --vs
A` in `--rounds` processes each; its decode p50 ratio has a 95% interval over every repetition,
beside an A/A control (the twin against a copy of itself). The runner form is measured with
psa-edge's loop and ExecuTorch's TextLLMRunner. Artifacts and raw JSON go to out/bench/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BENCH, MAX_LEN, artifact, commit, machine, page_with_block, psa_edge_json, \
    random_checkpoint, write_block, write_doc

from psa_edge.runtime.bench import geomean_ci

BUILDS = [("onnx", None), ("onnx", "int8"), ("xnnpack", None), ("xnnpack", "int8")]
FUSED = [("onnx", None), ("onnx", "int8-dynamic"), ("onnx", "int4")]  # --fused: ONNX's fused form
RUNNER = [("xnnpack", None), ("xnnpack", "int8-dynamic"), ("xnnpack", "int4")]  # --runner
OPTIMIZED = {"fused": FUSED, "runner": RUNNER}
GOAL = 1.02
RUNNER_DECODE = "executorch_runner_decode_time_per_token"  # TextLLMRunner's own ratio


def bench(a: Path, b: Path, args) -> dict:
    return psa_edge_json("bench", a, "--vs", b, "-p", args.p, "-n", args.n, "-r", args.r,
                         "--threads", args.threads)


def pooled_ratios(a: Path, b: Path, args, names: tuple[str, ...]) -> tuple[dict, dict]:
    """A / B ratios `names` of every repetition of `A --vs B` and (inverted) `B --vs A`, over
    `--rounds` rounds; and the first `A --vs B` report, for the tokens/s columns."""
    pooled, first = {name: [] for name in names}, None
    for _ in range(args.rounds):
        forward, backward = bench(a, b, args), bench(b, a, args)
        first = first or forward
        for name in names:
            pooled[name] += forward["ratio_psa_over_twin"][name]["per_rep"]
            pooled[name] += [1 / r for r in backward["ratio_psa_over_twin"][name]["per_rep"]]
    return first, pooled


def ratio_text(ratios: list[float]) -> str:
    summary = geomean_ci(ratios)
    low, high = summary["ci95"]
    return f"{summary['geomean']:.3f} [{low:.3f}, {high:.3f}]"


def verdict(ratios: list[float]) -> str:
    low, high = geomean_ci(ratios)["ci95"]
    return ("within the goal" if high <= GOAL else "above the goal" if low > GOAL else
            "not resolved (the interval contains the goal)")


def aa_control(twin: Path, args, names: tuple[str, ...]) -> dict:
    """The twin against a byte-identical copy of itself: the load-order bias and noise floor."""
    copy = twin.with_name(twin.name + "-aa-copy")
    if not copy.exists():
        shutil.copytree(twin, copy)
    return pooled_ratios(twin, copy, args, names)[1]


def gemm_peak(threads: int) -> float:
    """fp32 GFLOP/s of a 1024^3 numpy matmul (OpenBLAS) at `threads`, best of 20."""
    code = ("import numpy as np, time\n"
            "a = np.random.rand(1024, 1024).astype(np.float32); b = a.copy(); a @ b\n"
            "best = min((lambda t: (a @ b, time.perf_counter() - t)[1])(time.perf_counter())"
            " for _ in range(20))\n"
            "print(2 * 1024 ** 3 / best / 1e9)")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, check=True).stdout)


def main_rows(rows, args, peak) -> tuple[list[str], list[str]]:
    pp, tg = f"pp{args.p}", f"tg{args.n}"
    table = [f"| preset | backend | precision | {pp} t/s PSA | {pp} t/s twin | {tg} t/s PSA | "
             f"{tg} t/s twin | decode p50 ms PSA / twin | p50 ratio [95% CI] | GFLOP/s | "
             f"% of fp32 peak |", "|" + "---|" * 11]
    above = []
    for preset, target, precision, report, ratios in rows:
        a, b = report["results"]
        rate = a["flops_per_token"]["total"] * a[tg]["tokens_per_second"] / 1e9
        backend = "ONNX Runtime" if target == "onnx" else "ExecuTorch XNNPACK"
        table.append(
            f"| {preset} | {backend} | {precision} | {a[pp]['tokens_per_second']:.0f} ± "
            f"{a[pp]['stddev']:.0f} | {b[pp]['tokens_per_second']:.0f} ± {b[pp]['stddev']:.0f} | "
            f"{a[tg]['tokens_per_second']:.1f} ± {a[tg]['stddev']:.1f} | "
            f"{b[tg]['tokens_per_second']:.1f} ± {b[tg]['stddev']:.1f} | "
            f"{a[tg]['latency_ms_p50']:.3f} / {b[tg]['latency_ms_p50']:.3f} | "
            f"**{ratio_text(ratios)}** | {rate:.2f} | {100 * rate / peak:.1f} |")
        if verdict(ratios) != "within the goal":
            above.append(f"{preset} {backend} {precision} ({verdict(ratios)})")
    return table, above


def write(rows, runner, controls, peak, args, wall) -> None:
    from psa_edge.display import bench_plot

    p50 = f"tg{args.n}_latency_p50"
    table, above = main_rows(rows, args, peak)
    reps = 2 * args.rounds * args.r
    aa = (f"A/A control (the {rows[0][0]} {rows[0][1]} fp32 twin against a copy of itself, "
          f"{reps} repetitions): p50 ratio {ratio_text(controls[0][p50])}, where the truth is "
          f"1.000.")
    runner_text = "; ".join(f"{preset}: psa-edge's loop p50 {ratio_text(r[p50])}, "
                            f"TextLLMRunner per token {ratio_text(r[RUNNER_DECODE])}"
                            for preset, r in runner)
    runner_aa = (f"psa-edge's loop p50 {ratio_text(controls[1][p50])}, TextLLMRunner per token "
                 f"{ratio_text(controls[1][RUNNER_DECODE])}")
    share = max(r[3]["results"][0]["flops_per_token"]["shear"]
                / r[3]["results"][0]["flops_per_token"]["total"] for r in rows)
    goal = ("Every pair is within the 1.02 goal." if not above else
            "Pairs not shown within 1.02: " + "; ".join(above) + ".")
    bench_plot([r[3] for r in rows], Path(__file__).resolve().parent.parent / "docs"
               / "benchmarks.png", [r[0] for r in rows])
    (BENCH / "results.json").write_text(json.dumps(
        {"rows": [r[3] for r in rows], "p50_ratios": [r[4] for r in rows], "runner": runner,
         "aa_control": controls, "gemm_peak_gflops": peak}, indent=1, default=float))
    block = (f"{machine()}, {args.threads} thread(s), random-weight presets, max length "
             f"{MAX_LEN}; PSA and its twin interleaved, {reps} repetitions per pair in "
             f"{2 * args.rounds} processes. The p50 ratio is PSA's median time per decoded token "
             f"over the twin's (geometric mean over repetitions, 95% interval; 1.000 = the "
             f"shear costs nothing). {goal} {aa}\n\n" + "\n".join(table)
             + f"\n\nRunner form (ExecuTorch XNNPACK fp32, caches inside the program), PSA / "
               f"twin decode: {runner_text}; A/A control: {runner_aa}.\n")
    write_block("bench", block)
    command = (f".venv/bin/python tools/bench_presets.py --threads {args.threads} -p {args.p} "
               f"-n {args.n} -r {args.r} --rounds {args.rounds}")
    write_block("presets", f"""Made by `{command}` in {wall / 60:.0f} min on {machine()}. Each
pair is `psa-edge bench PSA --vs TWIN` and its inverse, {args.r} repetitions per process; each
repetition opens both artifacts afresh and warms them up, and their decode steps alternate in
turns of about 4 ms (A B / B A), so a slow spell of this shared VM falls on both. The tokens/s
columns come from those interleaved runs, where each model finds the other's weights in its
caches after every turn: they are below what an artifact reaches alone. Measured fp32 peak:
{peak:.1f} GFLOP/s (numpy/OpenBLAS 1024^3 GEMM, {args.threads} thread(s), best of 20); FLOPs
per decoded token are those of `lab.bench.flops_per_token` at context {args.n // 2}.

![tokens/s](benchmarks.png)

{block}
The shear's arithmetic is 3 d FLOPs per sheared stream and layer, at most {share:.1e} of a
token's FLOPs here: what a ratio above 1 measures is per-op and per-tensor overhead of the
runtime (the slot inputs, the raw-key output, the shear's three small ops), which weighs most on the
smallest preset. The runner form's slots live inside the program, so its ratios do not carry
over to the explicit-state form. This run was made at commit {commit()}; the runner section
below is measured on its own (`--runner`) and names the commit it ran at.""",
                "docs/results/benchmarks.md")
    print(block)


def build_ratios(preset: str, builds, form: str, args) -> list[tuple]:
    """(preset, target, precision, first report, pooled decode p50 ratios) per build."""
    p50 = f"tg{args.n}_latency_p50"
    rows = []
    for target, quant in builds:
        psa, twin = (artifact(preset, target, quant, t, form) for t in (0, 1))
        report, ratios = pooled_ratios(psa, twin, args, (p50,))
        rows.append((preset, target, quant or "fp32", report, ratios[p50]))
        print(f"{preset} {target} {form} {quant or 'fp32'}: {ratio_text(ratios[p50])}",
              flush=True)
    return rows


def optimized_ratios(args, form: str) -> None:
    """docs/results/benchmarks.md's block of an optimized form (`fused`, `runner`; at more than one
    thread `fused-2-threads` and so on): its builds' PSA / twin decode ratios and an A/A
    control."""
    p50 = f"tg{args.n}_latency_p50"
    block = form if args.threads == 1 else f"{form}-{args.threads}-threads"
    page_with_block(block, "docs/results/benchmarks.md")  # before measuring, not after
    builds = OPTIMIZED[form]
    rows = [row for preset in args.presets for row in build_ratios(preset, builds, form, args)]
    twin = artifact(args.presets[0], builds[0][0], None, True, form)
    control = aa_control(twin, args, (p50,))[p50]
    table, above = main_rows(rows, args, gemm_peak(args.threads))
    goal = ("Every pair is within the 1.02 goal." if not above else
            "Pairs not shown within 1.02: " + "; ".join(above) + ".")
    write_block(block, f"{machine()}, commit {commit()}, {args.threads} thread(s), -p {args.p} "
                f"-n {args.n}, {2 * args.rounds * args.r} repetitions per pair. {goal} A/A "
                f"control (the {args.presets[0]} fp32 {form} twin against a copy of itself): p50 "
                f"ratio {ratio_text(control)}.\n\n" + "\n".join(table),
                "docs/results/benchmarks.md")


def peak_rss_mb(build: Path, depth: int, args) -> float:
    """The smallest VmHWM over `--rounds` processes of one `bench -r 1` at `depth`."""
    return min(psa_edge_json("bench", build, "-p", args.p, "-n", args.n, "-r", 1, "--depth",
                             depth, "--threads", args.threads)["peak_rss_bytes"]
               for _ in range(args.rounds)) / 2**20


def memory(args) -> None:
    """docs/results/benchmarks.md's memory block: the fused form's peak RSS against the
    explicit-state form's, both built at MAX_LEN, after -p/-n alone and with a context that fills
    MAX_LEN."""
    full = MAX_LEN - max(args.p, args.n)
    lines = [f"| preset | precision | fused / explicit MB, depth 0 | the same, depth {full} |",
             "|---|---|---|---|"]
    for preset in args.presets:
        for _, quant in FUSED:
            mb = {(form, depth): peak_rss_mb(artifact(preset, "onnx", quant, False, form),
                                             depth, args)
                  for form in ("fused", "explicit-state") for depth in (0, full)}
            lines.append(f"| {preset} | {quant or 'fp32'} | " + " | ".join(
                f"{mb['fused', d]:.0f} / {mb['explicit-state', d]:.0f}" for d in (0, full))
                + " |")
            print(lines[-1], flush=True)
    write_block("memory", f"{machine()}, {args.threads} thread(s), ONNX Runtime, PSA builds at "
                f"max length {MAX_LEN}: peak RSS (VmHWM, the smallest of {args.rounds} "
                f"processes) of `psa-edge bench -p {args.p} -n {args.n} -r 1` with no context "
                f"and with {full} context tokens, so that decode ends at the max length.\n\n"
                + "\n".join(lines), "docs/results/benchmarks.md")


def export_sizes(args) -> None:
    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.model import PSATransformer, count_parameters, preset_config

    lines = ["| preset | parameters | target | export time (s) | model file (MB) | "
             "checkpoint (MB) | parity max abs err | XNNPACK-delegated nodes |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            ckpt = random_checkpoint(preset, Path(tmp) / f"{preset}.pt")
            params = count_parameters(PSATransformer(preset_config(preset)))
            for target in ("onnx", "xnnpack", "portable"):
                started = time.time()
                m = run_export(ExportRequest(ckpt, target, Path(tmp) / target, 256))
                delegated = (m["delegation"] or {}).get("delegated_fraction")
                lines.append(f"| {preset} | {params / 1e6:.2f}M | {target} | "
                             f"{time.time() - started:.1f} | {m['size_bytes'] / 1e6:.2f} | "
                             f"{ckpt.stat().st_size / 1e6:.2f} | "
                             f"{max(m['parity']['max_abs_logit_error'].values()):.1e} | "
                             f"{'' if delegated is None else f'{100 * delegated:.0f}%'} |")
                print(lines[-1], flush=True)
    write_doc("export-sizes.md", f"""# Export time and artifact size

Made by `.venv/bin/python tools/bench_presets.py --exports --presets {' '.join(args.presets)}`
on {machine()}. Random weights (seed 0), key-only gamma_k = 0.8, max_seq_len 256, fp32. Time
is the whole `psa-edge export` pipeline: load, torch.export, lowering, serialization and the
parity probe.

""" + "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m"])
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=1, help="Processes per pair and order.")
    parser.add_argument("--exports", action="store_true", help="export sizes and times only")
    parser.add_argument("--fused", action="store_true", help="only the fused form's ratios")
    parser.add_argument("--runner", action="store_true", help="only the runner form's ratios")
    parser.add_argument("--memory", action="store_true", help="only peak RSS, fused/explicit")
    args = parser.parse_args()
    if args.exports:
        return export_sizes(args)
    if args.fused or args.runner:
        return optimized_ratios(args, "fused" if args.fused else "runner")
    if args.memory:
        return memory(args)
    started = time.time()
    peak = gemm_peak(args.threads)
    p50 = f"tg{args.n}_latency_p50"
    rows, runner = [], []
    for preset in args.presets:
        rows += build_ratios(preset, BUILDS, "explicit-state", args)
        psa, twin = (artifact(preset, "xnnpack", None, t, "runner") for t in (0, 1))
        runner.append((preset, pooled_ratios(psa, twin, args, (p50, RUNNER_DECODE))[1]))
    first = args.presets[0]
    controls = (aa_control(artifact(first, "onnx", None, True, "explicit-state"), args, (p50,)),
                aa_control(artifact(first, "xnnpack", None, True, "runner"), args,
                           (p50, RUNNER_DECODE)))
    write(rows, runner, controls, peak, args, time.time() - started)


if __name__ == "__main__":
    main()
