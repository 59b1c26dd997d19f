"""The quantization table of docs/results/overview.md and docs/results/quantization.md: the
default model and its twin, fp32, int8 (static, dynamic, block-wise on ONNX) and int4 (groups of
32 and of 128) for XNNPACK and ONNX Runtime, each build checked by `psa-edge quant-check`; and
the measurement behind `--keep-shear-fp32`.

    .venv/bin/python tools/quant_table.py               # about 10 minutes on 2 cores
    .venv/bin/python tools/quant_table.py --samples 32  # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from common import DEFAULT_MODEL, OUT, machine, quant_spec, write_block, write_doc

from psa_edge.checks import quant_check
from psa_edge.export.pipeline import TARGETS as BACKENDS
from psa_edge.export.pipeline import ExportRequest, run_export
from psa_edge.export.quantize import QuantSpec

QUANT_OUT = OUT / "quant"
TARGETS = ("xnnpack", "onnx")
SCHEMES = {name: quant_spec(name)
           for name in ("int8", "int8-dynamic", "int8-block", "int4", "int4-g128")}
SHEAR_INT8 = QuantSpec("int8", keep_shear_fp32=False)


def export(checkpoint: Path, target: str, spec: QuantSpec | None, twin: bool, name: str) -> dict:
    path = QUANT_OUT / name
    manifest = run_export(ExportRequest(checkpoint, target, path, twin=twin, quant=spec))
    return {"path": path, "manifest": manifest}


def check(checkpoint: Path, artifact: Path, samples: int) -> dict:
    return quant_check.run(quant_check.prepare(checkpoint, artifact, samples=samples))


def measure(checkpoint: Path, samples: int) -> dict:
    rows = {}
    for twin in (False, True):
        model = "twin" if twin else "psa"
        for target in TARGETS:
            base = export(checkpoint, target, None, twin, f"{model}-{target}-fp32")
            for scheme, spec in ((k, v) for k, v in SCHEMES.items()
                                 if v.scheme in BACKENDS[target].schemes):
                built = export(checkpoint, target, spec, twin, f"{model}-{target}-{scheme}")
                started = time.time()
                result = check(checkpoint, built["path"], samples)
                rows[(model, target, scheme)] = {
                    "float_bytes": base["manifest"]["size_bytes"],
                    "bytes": built["manifest"]["size_bytes"],
                    "export_seconds": built["manifest"]["export_seconds"],
                    "check_seconds": round(time.time() - started, 1), **result}
                print(f"{model} {target} {scheme}: top-1 {result['metrics']['top1_agreement']:.4f}"
                      f" acc delta {result['metrics']['accuracy_delta_points']:+.2f} points",
                      flush=True)
    for target in TARGETS:
        built = export(checkpoint, target, SHEAR_INT8, False, f"psa-{target}-int8-shear")
        rows[("psa", target, "int8, shear int8")] = {
            "bytes": built["manifest"]["size_bytes"], **check(checkpoint, built["path"], samples)}
    return rows


def main_table(rows: dict) -> str:
    lines = ["| model | backend | scheme | size (MB) | x float | accuracy float | accuracy "
             "quantized | delta (points) | top-1 agreement | KL mean | KL p99 | max abs logit err "
             "| check |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, target, scheme), r in rows.items():
        if "shear" in scheme:
            continue
        m = r["metrics"]
        label = "PSA (key-only, gamma_k 0.8)" if model == "psa" else "twin (gamma 0)"
        lines.append(
            f"| {label} | {'ExecuTorch XNNPACK' if target == 'xnnpack' else 'ONNX Runtime'} | "
            f"{scheme} | {r['bytes'] / 1e6:.2f} | {r['bytes'] / r['float_bytes']:.2f} | "
            f"{m['accuracy_float']:.4f} | {m['accuracy_artifact']:.4f} | "
            f"{m['accuracy_delta_points']:+.2f} | {m['top1_agreement']:.4f} | "
            f"{m['kl_mean']:.1e} | {m['kl_p99']:.1e} | {m['max_abs_logit_error']:.2f} | "
            f"{'PASS' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def shear_table(rows: dict) -> str:
    lines = ["| backend | shear | delta (points) | top-1 agreement | KL mean | KL p99 | "
             "RMS dp top |", "|---|---|---|---|---|---|---|"]
    for target in TARGETS:
        for scheme, label in (("int8", "fp32 (default)"), ("int8, shear int8", "int8")):
            m = rows[("psa", target, scheme)]["metrics"]
            lines.append(f"| {'ExecuTorch XNNPACK' if target == 'xnnpack' else 'ONNX Runtime'} "
                         f"| {label} | {m['accuracy_delta_points']:+.2f} | "
                         f"{m['top1_agreement']:.4f} | {m['kl_mean']:.2e} | {m['kl_p99']:.2e} | "
                         f"{m['rms_dp_top']:.4f} |")
    return "\n".join(lines)


def verdicts(rows: dict) -> str:
    psa = [r for (m, _, s), r in rows.items() if m == "psa" and s in ("int8", "int8-dynamic")]
    worst_drop = max(-r["metrics"]["accuracy_delta_points"] for r in psa)
    worst_top1 = min(r["metrics"]["top1_agreement"] for r in psa)
    worst_size = max(r["bytes"] / r["float_bytes"] for r in psa)
    int8 = {model: [r["metrics"]["kl_mean"] for (m, _, s), r in rows.items()
                    if m == model and s.startswith("int8") and "shear" not in s]
            for model in ("psa", "twin")}
    kl = {model: sum(values) / len(values) for model, values in int8.items()}
    shear_costs = all(rows[("psa", t, "int8, shear int8")]["metrics"]["top1_agreement"]
                      < rows[("psa", t, "int8")]["metrics"]["top1_agreement"] for t in TARGETS)
    holds = worst_drop <= 1 and worst_top1 >= 0.98 and worst_size <= 0.35
    return (f"- Default model, every int8 build: accuracy drop at most {worst_drop:.2f} points "
            f"(bound 1.0), top-1 agreement at least {worst_top1:.4f} (bound 0.98), size at most "
            f"{worst_size:.2f} x the float artifact (bound 0.35): "
            f"{'all hold' if holds else 'NOT all hold'}.\n"
            f"- Mean KL(float || int8) over the {len(int8['psa'])} int8 builds: PSA "
            f"{kl['psa']:.2e}, twin "
            f"{kl['twin']:.2e}.\n"
            f"- Quantizing the shear lowers top-1 agreement on "
            f"{'both backends' if shear_costs else 'not every backend'}; the exporter keeps it "
            f"fp32 unless `--quantize-shear` is given.")


def write(rows: dict, samples: int, wall: float) -> None:
    any_row = next(iter(rows.values()))
    task = any_row["task"]
    block = (f"Default model `models/psa-default.pt` and its gamma = 0 twin (same weights, no "
             f"shear), {samples} held-out {task['name']} sequences x "
             f"{any_row['tokens_per_sample']} tokens, each quantized artifact run token by token "
             f"through its incremental interface (`psa-edge quant-check`, with its bounds for "
             f"the scheme: int4's top-1 floor is 0.90, int8's 0.98). int4-g128 is int4 with "
             f"`--group-size 128`: a scale per 128 weights instead of 32.\n\n"
             f"{main_table(rows)}\n\n{verdicts(rows)}\n")
    doc = f"""# Quantization: int8 and int4

Made by `.venv/bin/python tools/quant_table.py --samples {samples}` on {machine()} in
{wall / 60:.0f} min. Every number below is from that run.

What is quantized and how each backend does it: [spec.md §6](spec.md#6-quantization).

## Results

{block}
The twin's task accuracy is at chance: its weights were trained with the shear. Its KL and
top-1 agreement still say how much int8 moves plain attention's output on the same weights.

## Should the shear be quantized? (`--keep-shear-fp32`, the default)

The shear computes k_j - k_(j-1), a difference of two nearly equal keys. Static int8 builds of
the PSA model with the shear's Sub/Mul/Add quantized too (int8 in and out, calibrated):

{shear_table(rows)}

The default keeps the shear fp32; `--quantize-shear` quantizes it. Dynamic activation
quantization applies to linears only, so there the shear is always fp32.
"""
    write_doc("quantization.md", doc)
    write_block("quant", block)
    (QUANT_OUT / "results.json").write_text(json.dumps(
        {"samples": samples, "wall_seconds": wall,
         "rows": {" / ".join(k): v for k, v in rows.items()}}, indent=1, default=str))
    print(block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--render", action="store_true", help="the pages from the last results")
    args = parser.parse_args()
    if args.render:
        saved = json.loads((QUANT_OUT / "results.json").read_text())
        rows = {tuple(k.split(" / ")): v for k, v in saved["rows"].items()}
        return write(rows, saved["samples"], saved["wall_seconds"])
    QUANT_OUT.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows = measure(DEFAULT_MODEL, args.samples)
    write(rows, args.samples, time.time() - started)


if __name__ == "__main__":
    main()
