"""docs/benchmarks.md: prefill and decode speed of the psa-4m and psa-30m presets on this
machine, ONNX Runtime and ExecuTorch XNNPACK, fp32 and int8, PSA (key-only, gamma_k 0.8)
against its gamma = 0 twin, measured interleaved by `psa-edge bench --vs`.

    python tools/bench_presets.py --threads 1 -r 20     # about 17 minutes on 2 cores, 33
                                                        # with --rounds 2 (plus ~10 to export)
    python tools/bench_presets.py --presets psa-4m -r 5 # quicker

Models have random weights (seed 0): speed does not depend on what the weights learned. The
int8 builds calibrate on random ih-sht sequences of the model's vocabulary. Each pair is
benchmarked in 2 x `--rounds` processes (`psa-edge bench A --vs B --json` and B --vs A in
turn) and its decode p50 ratio given with a 95% interval over every repetition, beside an A/A
control (the twin against a copy of itself, also for the runner form); the machine's fp32 peak is
measured with a numpy (OpenBLAS) GEMM at the same thread count; FLOPs per decoded token come
from the bench report (`runtime.bench.flops_per_token`, checked against torch's FLOP counter
in the tests). For every pair not shown within the 1.02 goal, the structural profile is
listed: the ONNX nodes / ExecuTorch instructions the PSA program runs that the twin does not.
The runner-form `.pte` is benchmarked alone (psa-edge's loop beside ExecuTorch's TextLLMRunner)
and against its runner-form twin, with both loops' PSA / twin ratios.
Artifacts and raw JSON go to out/bench/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "out" / "bench"
sys.path.insert(0, str(REPO))

from psa_edge.runtime.bench import geomean_ci  # noqa: E402

BUILDS = [("onnx", None), ("onnx", "int8"), ("xnnpack", None), ("xnnpack", "int8")]
MAX_LEN = 512
GOAL = 1.02
# The runner form's PSA / twin ratio as ExecuTorch's TextLLMRunner times it (its Stats).
RUNNER_DECODE = "executorch_runner_decode_time_per_token"


def checkpoint(preset: str) -> Path:
    import torch

    from psa_edge.model import PSATransformer, preset_config
    from psa_edge.model.checkpoint import save_checkpoint

    path = OUT / f"{preset}.pt"
    if not path.exists():
        torch.manual_seed(0)
        model = PSATransformer(preset_config(preset, "key-only", 0.8))
        vocab = model.cfg.vocab_size
        save_checkpoint(path, model, {"task": {"name": "ih-sht", "params": {
            "seq_len": 256, "alphabet": vocab}}, "note": "random weights (seed 0), for speed"})
    return path


def up_to_date(manifest_file: Path, checkpoint_sha256: str) -> bool:
    """Whether an artifact exists that was exported from this checkpoint with the graph I/O and
    int8 activation scheme the exporter writes today (older builds are exported again)."""
    from psa_edge.export.graphs import output_names
    from psa_edge.export.quantize import QuantSpec, activations
    from psa_edge.model.config import ModelConfig

    if not manifest_file.exists():
        return False
    manifest = json.loads(manifest_file.read_text())
    same_io = (manifest["form"] == "runner" or manifest["io"]["outputs"]
               == output_names(ModelConfig.from_dict(manifest["config"])))
    quant = manifest.get("quantization")
    same_quant = quant is None or quant["activations"] == activations(
        QuantSpec(quant["scheme"]), manifest["target"])
    return same_io and same_quant and manifest["source_checkpoint"]["sha256"] == checkpoint_sha256


def artifact(ckpt: Path, target: str, quant: str | None, twin: bool, form: str = "explicit-state"
             ) -> Path:
    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.export.quantize import QuantSpec
    from psa_edge.io import sha256_file

    name = ".".join([ckpt.stem, target, quant or "fp32"] + (["runner"] if form == "runner"
                                                            else []) + (["twin"] if twin else []))
    path = OUT / (name + (".onnx" if target == "onnx" else ".pte"))
    if up_to_date(Path(f"{path}.json"), sha256_file(ckpt)):
        return path
    started = time.time()
    run_export(ExportRequest(ckpt, target, path, MAX_LEN, twin, form,
                             QuantSpec(quant) if quant else None))
    print(f"  exported {path.name} in {time.time() - started:.0f} s", flush=True)
    return path


def bench(a: Path, b: Path | None, args) -> dict:
    cmd = [sys.executable, "-m", "psa_edge.cli", "bench", str(a), "-p", str(args.p), "-n",
           str(args.n), "-r", str(args.r), "--threads", str(args.threads), "--json"]
    if b is not None:
        cmd += ["--vs", str(b)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    if result.returncode:
        raise SystemExit(f"bench failed: {' '.join(cmd)}\n{result.stderr[-2000:]}")
    return json.loads(result.stdout)


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


def structural_profile(a: Path, b: Path) -> str:
    """What the PSA program executes per decoded token that its twin does not."""
    from collections import Counter

    if a.suffix == ".onnx":
        diff = ort_node_types(a) - ort_node_types(b)
        return "nodes only in the PSA graph as ONNX Runtime runs it: " + (", ".join(
            f"{k} x{v}" for k, v in sorted(diff.items())) or "none")
    reports = [json.loads(Path(f"{p}.json").read_text())["delegation"] for p in (a, b)]
    decode = [r.get("methods", {}).get("decode", r) for r in reports]
    outside = [Counter({k: v["count"] for k, v in d["ops_outside_delegate"].items()})
               for d in decode]
    extra = outside[0] - outside[1]
    return (f"method `decode`: {decode[0]['delegated_subgraphs']} XNNPACK delegate calls "
            f"(twin {decode[1]['delegated_subgraphs']}); ops outside the delegate only in PSA: "
            + (", ".join(f"{k} x{v}" for k, v in sorted(extra.items())) or "none"))


def ort_node_types(path: Path):
    """Node types of the graph ONNX Runtime executes (after its optimizations, which add and
    fuse nodes), counted."""
    import tempfile
    from collections import Counter

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.log_severity_level = 1, 3
        options.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
        return Counter(n.op_type for n in graph.node)


def partition_facts(rows) -> str:
    out = []
    for preset, target, precision, psa, twin, _ in rows:
        if target != "xnnpack":
            continue
        d = [json.loads(Path(f"{p}.json").read_text())["delegation"] for p in (psa, twin)]
        out.append(f"  - {preset} {precision}: `forward` {d[0]['delegated_subgraphs']} / "
                   f"{d[1]['delegated_subgraphs']}, `decode` "
                   f"{d[0]['methods']['decode']['delegated_subgraphs']} / "
                   f"{d[1]['methods']['decode']['delegated_subgraphs']}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m"])
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=1, help="Processes per pair and order.")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    started, cpu_before = time.time(), cpu_times()
    peak = gemm_peak(args.threads)
    print(f"fp32 GEMM peak at {args.threads} threads: {peak:.1f} GFLOP/s", flush=True)
    rows, reports, runner_reports = [], [], []
    for preset in args.presets:
        ckpt = checkpoint(preset)
        for target, quant in BUILDS:
            psa, twin = (artifact(ckpt, target, quant, t) for t in (False, True))
            report, pooled = process_ratios(psa, twin, args)
            ratios = report["p50_ratios"] = pooled[p50(args)]
            reports.append(report)
            rows.append((preset, target, quant or "fp32", psa, twin, report))
            print(f"{preset} {target} {quant or 'fp32'}: decode p50 ratio "
                  f"{ratio_text(ratios)}", flush=True)
        runner, runner_twin = (artifact(ckpt, "xnnpack", None, t, "runner")
                               for t in (False, True))
        pair = process_ratios(runner, runner_twin, args, (p50(args), RUNNER_DECODE))[1]
        runner_reports.append((preset, runner_twin, bench(runner, None, args), pair))
    control = aa_control(" ".join(rows[0][:3]) + " twin", rows[0][4], args)
    runner_control = aa_control(f"{args.presets[0]} runner-form twin", runner_reports[0][1], args,
                                (p50(args), RUNNER_DECODE))
    write(rows, runner_reports, reports, peak, (control, runner_control), args,
          (time.time() - started, steal_share(cpu_before, cpu_times())))


def p50(args) -> str:
    """The ratio compared with the goal: per repetition, PSA's median decode latency over the
    twin's."""
    return f"tg{args.n}_latency_p50"


def process_ratios(a: Path, b: Path, args, names: tuple[str, ...] = ()
                   ) -> tuple[dict, dict[str, list[float]]]:
    """A / B ratios `names` (default: the p50 ratio) of every repetition of 2 x `--rounds`
    processes, `A --vs B` and `B --vs A` (inverted) in turn, so that neither artifact is always
    the first loaded. Returns the first process's report (for the tokens/s columns) and, per
    name, every ratio."""
    names = names or (p50(args),)
    reports, pooled = [], {name: [] for name in names}
    for _ in range(args.rounds):
        forward, backward = bench(a, b, args), bench(b, a, args)
        reports.append(forward)
        for name in names:
            pooled[name] += forward["ratio_psa_over_twin"][name]["per_rep"]
            pooled[name] += [1 / r for r in backward["ratio_psa_over_twin"][name]["per_rep"]]
    return reports[0], pooled


def verdict_of(ratios: list[float]) -> str:
    """Where the 95% interval of the geometric mean lies against the goal."""
    low, high = geomean_ci(ratios)["ci95"]
    return ("within the goal" if high <= GOAL else "above the goal" if low > GOAL else
            "not resolved (the interval contains the goal)")


def ratio_text(ratios: list[float]) -> str:
    summary = geomean_ci(ratios)
    low, high = summary["ci95"]
    return f"{summary['geomean']:.3f} [{low:.3f}, {high:.3f}]"


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs since boot, from Linux /proc/stat; None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal; guest time is already inside user/nice
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Fraction of CPU time a hypervisor took from this machine between two `cpu_times()`."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def steal_sentence(share: float | None) -> str:
    if share is None:
        return "CPU steal not measurable here"
    return f"the hypervisor took {share:.1%} of the CPU time during the run (steal, /proc/stat)"


def aa_control(label: str, twin: Path, args, names: tuple[str, ...] = ()) -> dict:
    """The twin against a byte-identical copy of itself, in one process as `--vs` runs it: any
    ratio away from 1 is the load-order bias and the noise floor of the measurement."""
    import shutil

    copy = OUT / f"aa-copy.{twin.name}"
    shutil.copyfile(twin, copy)
    shutil.copyfile(f"{twin}.json", f"{copy}.json")
    return {"pair": label, "ratios": process_ratios(twin, copy, args, names)[1]}


def runner_pair_text(ratios: dict[str, list[float]], args) -> str:
    """The runner form's two ratios, by psa-edge's loop and by ExecuTorch's TextLLMRunner."""
    return (f"psa-edge's loop p50 {ratio_text(ratios[p50(args)])}, TextLLMRunner per token "
            f"{ratio_text(ratios[RUNNER_DECODE])}")


def aa_sentence(control: dict, name: str) -> str:
    ratios = control["ratios"][name]
    return (f"A/A control ({control['pair']} against a copy of itself, measured the same way, "
            f"{len(ratios)} repetitions): p50 ratio {ratio_text(ratios)}, where the truth is "
            f"1.000.")


def write(rows, runner_reports, reports, peak, controls, args, run) -> None:
    wall, steal = run
    control, runner_control = controls
    from psa_edge.display import bench_plot

    pp, tg = f"pp{args.p}", f"tg{args.n}"
    m = reports[0]["machine"]
    lines = [f"| preset | backend | precision | {pp} t/s PSA | {pp} t/s twin | {pp} time ratio "
             f"| {tg} t/s PSA | {tg} t/s twin | {tg} time ratio [range] | decode p50 ms PSA / "
             f"twin | p50 ratio [95% CI] | GFLOP per token | GFLOP/s | "
             f"% of fp32 peak |", "|" + "---|" * 14]
    over = []
    for preset, target, precision, psa_path, twin_path, report in rows:
        a, b = report["results"]
        ratio = report["ratio_psa_over_twin"]
        ratios = report["p50_ratios"]
        flops = a["flops_per_token"]["total"]
        rate = flops * a[tg]["tokens_per_second"] / 1e9
        tg_ratio = ratio[f"{tg}_time"]
        lines.append(
            f"| {preset} | {'ONNX Runtime' if target == 'onnx' else 'ExecuTorch XNNPACK'} | "
            f"{precision} | {a[pp]['tokens_per_second']:.0f} ± {a[pp]['stddev']:.0f} | "
            f"{b[pp]['tokens_per_second']:.0f} ± {b[pp]['stddev']:.0f} | "
            f"{ratio[f'{pp}_time']['median']:.3f} | {a[tg]['tokens_per_second']:.1f} ± "
            f"{a[tg]['stddev']:.1f} | {b[tg]['tokens_per_second']:.1f} ± {b[tg]['stddev']:.1f} | "
            f"{tg_ratio['median']:.3f} [{tg_ratio['min']:.3f}, {tg_ratio['max']:.3f}] | "
            f"{a[tg]['latency_ms_p50']:.3f} / {b[tg]['latency_ms_p50']:.3f} | "
            f"**{ratio_text(ratios)}** | "
            f"{flops / 1e9:.4f} | {rate:.2f} | {100 * rate / peak:.1f} |")
        pair_verdict = verdict_of(ratios)
        if pair_verdict != "within the goal":
            over.append(f"- {preset} {target} {precision}: p50 ratio {ratio_text(ratios)}, "
                        f"{pair_verdict}. {structural_profile(psa_path, twin_path)}.")
    runner_lines = ["| preset | psa-edge loop decode t/s | ExecuTorch TextLLMRunner decode t/s | "
                    "psa-edge loop prefill t/s | TextLLMRunner prefill t/s | PSA / twin, psa-edge "
                    "loop: decode p50 ratio [95% CI] | PSA / twin, TextLLMRunner: decode time per "
                    "token ratio [95% CI] |", "|" + "---|" * 7]
    runner_verdicts, runner_ratios = [], []
    for preset, _, report, pair in runner_reports:
        own = report["results"][0]
        et = own["executorch_runner"]
        runner_lines.append(
            f"| {preset} | {own[tg]['tokens_per_second']:.1f} ± {own[tg]['stddev']:.1f} | "
            f"{et['decode_tokens_per_second']:.1f} ± {et['decode_stddev']:.1f} | "
            f"{own[pp]['tokens_per_second']:.0f} ± {own[pp]['stddev']:.0f} | "
            f"{et['prefill_tokens_per_second']:.0f} ± {et['prefill_stddev']:.0f} | "
            f"{ratio_text(pair[p50(args)])} | {ratio_text(pair[RUNNER_DECODE])} |")
        runner_verdicts.append(f"{preset}: psa-edge's loop {verdict_of(pair[p50(args)])}, "
                               f"TextLLMRunner {verdict_of(pair[RUNNER_DECODE])}")
        runner_ratios.append(f"{preset} {runner_pair_text(pair, args)}")
    delegate_calls = partition_facts(rows)
    shear_share = max(r[-1]["results"][0]["flops_per_token"]["shear"]
                      / r[-1]["results"][0]["flops_per_token"]["total"] for r in rows)
    bench_plot(reports, REPO / "docs" / "benchmarks.png")
    (OUT / "results.json").write_text(json.dumps(
        {"rows": [r[-1] for r in rows],
         "runner": [{"alone": r[2], "psa_over_twin": r[3]} for r in runner_reports],
         "gemm_peak_gflops": peak, "aa_control": control,
         "runner_aa_control": runner_control}, indent=1, default=float))
    verdict = ("every pair is within the 1.02 goal (95% interval below it)" if not over else
               "pairs not shown within the 1.02 goal, with what the PSA program runs beyond its "
               "twin:\n\n" + "\n".join(over))
    doc = f"""# Benchmarks: PSA against its gamma = 0 twin

Made by `python tools/bench_presets.py --threads {args.threads} -p {args.p} -n {args.n} -r {args.r} --rounds {args.rounds}`
in {wall / 60:.0f} min on {m['cpu']} ({m['cores']} cores, {m['arch']}, {m['os']}), Python
{m['python']}, {platform.python_implementation()}; nothing else ran on the machine
({steal_sentence(steal)}). Models:
the `psa-4m` and `psa-30m` presets with random weights (seed 0; speed does not depend on what
the weights learned), key-only gamma_k 0.8, max length {MAX_LEN}; int8 is the exporter's static
int8 (per-channel weights, calibrated activations, shear fp32). Each row is one
`psa-edge bench PSA --vs TWIN` run: {args.r} repetitions, each opening both artifacts afresh
and warming them up, PSA and twin interleaved (A B / B A; their decode steps alternate in turns
of about 4 ms), tokens/s mean ± stddev over repetitions; ratios are PSA time / twin time
(1.000 = no overhead): prefill time ratio (median over repetitions), decode time ratio with
its median and range. The figure compared with the goal is the p50 ratio: per repetition,
PSA's median per-token decode latency over the twin's, pooled over {2 * args.rounds * args.r}
repetitions in {2 * args.rounds} processes (`bench PSA --vs TWIN` and `bench TWIN --vs PSA`,
inverted, so neither is always loaded first), as a geometric mean with its 95% confidence
interval. A pair meets the goal when the whole interval is at or below it. Why so much
machinery: on this shared VM the speed of one process drifts by up to 2x within minutes, and
what an opened session is fixed with (where its memory landed) moved an A/A ratio by several
percent; the A/A control below (the twin against a byte-identical copy of itself, measured the
same way) shows what is left. The interval covers what varies within a run, not the machine's
state across runs: two runs of this script on one day have disagreed by more than their
intervals on psa-4m ONNX fp32, so a pair near the goal needs more than one run. The tokens/s
columns come from the same interleaved runs, where each model finds the other's weights in its
caches after every turn: they are below what an artifact reaches alone. Threads: {args.threads}.
Measured fp32 peak of this machine: {peak:.1f} GFLOP/s (numpy/OpenBLAS
1024^3 GEMM, {args.threads} threads, best of 20). FLOPs per decoded token are 2 x the
multiply-adds of the linears, the attention over the mean context and the shear (3 d per
sheared stream), at context {args.n // 2}.

![tokens/s](benchmarks.png)

{chr(10).join(lines)}

Decode overhead of PSA over its twin (goal <= 1.02, p50 ratio [95% CI]): {verdict}

{aa_sentence(control, p50(args))} [decode-profile.md](decode-profile.md) splits one decode step into
the backend call, psa-edge's wrapper and the session, and by ONNX operator.

## psa-edge's Python loop against ExecuTorch's own runner

The same runner-form `.pte` (`--form runner`: the KV cache and the previous-key slots are
mutable buffers inside the program, over a static cache of {MAX_LEN} positions, behind
`forward(tokens, input_pos)`, as ExecuTorch's own LLM export), driven by psa-edge's loop from
Python and by ExecuTorch's C++ `TextLLMRunner` (its own Stats: ms timestamps; it counts
generated tokens without the first). The rates are the PSA file alone (`bench RUNNER`). The
PSA / twin ratios come from `bench RUNNER --vs TWIN` and its inverse, {2 * args.rounds * args.r}
repetitions: psa-edge's loop alternating in turns of about 4 ms as above, `TextLLMRunner`
alternating whole generations (A B / B A; its Stats time nothing finer), so a slow spell
inside one generation falls on one side and its interval is wider.

{chr(10).join(runner_lines)}

In this form the slots are buffers inside the program (a copy per layer and call, never passed
in or out), and every step attends over the whole static cache, masked, so a token costs more
than in the explicit-state `decode` method (compare the decode rates with the table above) and
the shear's fixed cost is a smaller share of it: these ratios do not carry over to the other
forms. Against the 1.02 goal:
{"; ".join(runner_verdicts)}. A/A control ({runner_control['pair']} against a copy of itself,
measured the same way, {len(runner_control['ratios'][RUNNER_DECODE])} repetitions):
{runner_pair_text(runner_control['ratios'], args)}, where the truth is 1.000.

## Reading it

- The shear's arithmetic is 3 d FLOPs per sheared stream and layer, at most {shear_share:.1e}
  of a decoded token's FLOPs here (`flops_per_token`): any measurable overhead is per-op and
  per-tensor overhead of the runtime, not arithmetic.
- Graph I/O: the PSA graph takes one previous-key slot per layer and returns the chunk's raw
  keys as one output, the layers stacked (their last row is the next slot); the twin has
  neither, its I/O is a plain Llama decoder's. Each extra input or output costs the runtime per
  call, not per FLOP.
- ExecuTorch programs carry a `decode` method (S = 1) beside `forward`. There the shear's
  shift needs no op, in fp32 and in int8 (the slot is the previous key; the int8 methods are
  re-traced from the quantized graph with the shift reattached as `ops.previous`), XNNPACK
  takes the Sub/Mul/Add, and the PSA program runs the same instructions outside XNNPACK as its
  twin (tested). In the dynamic-shape `forward` method (prefill, speculative verify) the
  shift's slices stay outside XNNPACK and split its partitions. XNNPACK delegate calls per
  call, from the manifests' delegation reports (PSA / twin):
{delegate_calls}
- Where the remaining per-token difference arises, by layer of the decode step (backend call,
  psa-edge's wrapper, the session, each timed with the same paired turns as here), on every
  backend split into the slot I/O and the shear's ops (a build with the shear bypassed), by ONNX
  operator type, and what the ONNX graph forms without the shift's Concat/Slice measure
  (decode-only, and both graphs merged behind an `If`):
  [decode-profile.md](decode-profile.md) (`tools/decode_profile.py`).
- Four candidate fixes for that difference, each built, checked to compute the same
  numbers and timed against the shipped build (one stacked slot input, RMSNorm's mean in
  XNNPACK's 4-D form, the keys in ONNX Runtime's layout, the decode-only ONNX graph in a second
  session sharing the weights), and why none is shipped:
  [overhead-candidates.md](overhead-candidates.md) (`tools/overhead_candidates.py`).
"""
    (REPO / "docs" / "benchmarks.md").write_text(doc)
    block = (f"{m['cpu']}, {args.threads} threads, random-weight presets, PSA and twin "
             f"interleaved, {2 * args.rounds * args.r} repetitions per pair in "
             f"{2 * args.rounds} processes; decode overhead of PSA (goal <= {GOAL}, p50 ratio, "
             f"geometric mean [95% CI]): {verdict}\n\n"
             f"{aa_sentence(control, p50(args))}\n\n"
             + "\n".join(lines) + "\n\n"
             "Runner form (ExecuTorch XNNPACK fp32, slots and cache inside the program, "
             "PSA / twin decode): " + "; ".join(runner_ratios) + f"; A/A control "
             f"({runner_control['pair']} against a copy of itself): "
             f"{runner_pair_text(runner_control['ratios'], args)}.\n")
    from psa_edge.io import write_marked_block

    write_marked_block(REPO / "README.md", "bench", block)
    print(doc)


if __name__ == "__main__":
    main()
