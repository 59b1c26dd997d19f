"""Export time and artifact size per preset and target, written to docs/export-sizes.md.

Each preset (random weights, seed 0, the preset's own vocabulary, key-only gamma_k = 0.8) is
saved as a checkpoint and exported through the real pipeline (`run_export`, parity check
included) to every target. Wall time is the whole `run_export` call on this machine.

    python tools/export_bench.py                      # tiny, psa-4m, psa-30m
    python tools/export_bench.py --presets tiny       # a subset
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = ("onnx", "xnnpack", "portable")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    import os

    import torch

    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.model import PSATransformer, count_parameters, preset_config
    from psa_edge.model.checkpoint import save_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "psa-4m", "psa-30m"])
    parser.add_argument("--max-seq-len", type=int, default=256)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            torch.manual_seed(0)
            model = PSATransformer(preset_config(preset))
            ckpt = Path(tmp) / f"{preset}.pt"
            save_checkpoint(ckpt, model, {"note": "random weights (export benchmark)"})
            for target in TARGETS:
                started = time.time()
                manifest = run_export(ExportRequest(ckpt, target, max_seq_len=args.max_seq_len))
                row = {"preset": preset, "params": count_parameters(model), "target": target,
                       "export_seconds": round(time.time() - started, 1),
                       "size_mb": round(manifest["size_bytes"] / 1e6, 2),
                       "checkpoint_mb": round(ckpt.stat().st_size / 1e6, 2),
                       "parity_max_abs_err": max(manifest["parity"]["max_abs_logit_error"].values()),
                       "delegated_fraction": (manifest["delegation"] or {}).get("delegated_fraction")}
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines = ["# Export time and artifact size", "",
             f"Made by `python tools/export_bench.py --presets {' '.join(args.presets)}` on "
             f"{cpu_model()} ({os.cpu_count()} cores, {platform.machine()}), torch "
             f"{torch.__version__}. Random weights (seed 0), key-only gamma_k = 0.8, "
             f"max_seq_len {args.max_seq_len}, fp32. Time is the whole `psa-edge export` "
             "pipeline: load, torch.export, lowering, serialization and the parity probe.", "",
             "| preset | parameters | target | export time (s) | artifact (MB) | checkpoint (MB) "
             "| parity max abs err | XNNPACK-delegated nodes |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        frac = "" if r["delegated_fraction"] is None else f"{100 * r['delegated_fraction']:.0f}%"
        lines.append(f"| {r['preset']} | {r['params'] / 1e6:.2f}M | {r['target']} | "
                     f"{r['export_seconds']} | {r['size_mb']} | {r['checkpoint_mb']} | "
                     f"{r['parity_max_abs_err']:.1e} | {frac} |")
    (REPO / "docs" / "export-sizes.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
