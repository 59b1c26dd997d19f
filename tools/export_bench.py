"""docs/export-sizes.md: export time and artifact size per preset and target.

Each preset (random weights, `common.random_checkpoint`) is exported through the real pipeline
(`run_export`, parity check included) to every target; wall time is the whole call.

    .venv/bin/python tools/export_bench.py                 # tiny, psa-4m, psa-30m
    .venv/bin/python tools/export_bench.py --presets tiny  # a subset
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from common import machine, random_checkpoint, write_doc

TARGETS = ("onnx", "xnnpack", "portable")


def main() -> None:
    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.model import PSATransformer, count_parameters, preset_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "psa-4m", "psa-30m"])
    parser.add_argument("--max-seq-len", type=int, default=256)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            ckpt = random_checkpoint(preset, Path(tmp) / f"{preset}.pt")
            params = count_parameters(PSATransformer(preset_config(preset)))
            for target in TARGETS:
                started = time.time()
                manifest = run_export(ExportRequest(ckpt, target, Path(tmp) / target,
                                                    args.max_seq_len))
                row = {"preset": preset, "params": params, "target": target,
                       "export_seconds": round(time.time() - started, 1),
                       "size_mb": round(manifest["size_bytes"] / 1e6, 2),
                       "checkpoint_mb": round(ckpt.stat().st_size / 1e6, 2),
                       "parity": max(manifest["parity"]["max_abs_logit_error"].values()),
                       "delegated": (manifest["delegation"] or {}).get("delegated_fraction")}
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines = ["# Export time and artifact size", "",
             f"Made by `.venv/bin/python tools/{Path(sys.argv[0]).name} --presets "
             f"{' '.join(args.presets)}` on {machine()}. Random weights (seed 0), key-only "
             f"gamma_k = 0.8, max_seq_len {args.max_seq_len}, fp32. Time is the whole "
             "`psa-edge export` pipeline: load, torch.export, lowering, serialization and the "
             "parity probe.", "",
             "| preset | parameters | target | export time (s) | model file (MB) | "
             "checkpoint (MB) | parity max abs err | XNNPACK-delegated nodes |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        frac = "" if r["delegated"] is None else f"{100 * r['delegated']:.0f}%"
        lines.append(f"| {r['preset']} | {r['params'] / 1e6:.2f}M | {r['target']} | "
                     f"{r['export_seconds']} | {r['size_mb']} | {r['checkpoint_mb']} | "
                     f"{r['parity']:.1e} | {frac} |")
    write_doc("export-sizes.md", "\n".join(lines))


if __name__ == "__main__":
    main()
