"""docs/runtime.md's measurement: is writing the caches in place with ONNX Runtime IO binding
(preallocated max-length buffers, the graph's concatenation writing into them) faster than
plain `InferenceSession.run` (ORT allocates the grown cache each call)?

    python tools/runtime_bench.py            # about 2 minutes

Per model and context length P: median per-token decode latency of a `Session` over 200 calls
at P (state reset to the same P-token prefix every 50 calls), the two paths alternating in
blocks of 50 so machine drift hits both; one intra-op thread. The default is whichever wins.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from psa_edge.io import write_marked_block  # noqa: E402
from psa_edge.runtime.graph import OnnxGraph, read_manifest  # noqa: E402
from psa_edge.runtime.session import Session  # noqa: E402


def export_models() -> dict[str, Path]:
    import torch

    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.model import PSATransformer, preset_config
    from psa_edge.model.checkpoint import save_checkpoint

    out = REPO / "out" / "runtime"
    out.mkdir(parents=True, exist_ok=True)
    models = {"default (psa-0.5m)": (REPO / "models" / "psa-default.pt", 256)}
    path = out / "psa-4m.pt"
    if not path.exists():
        torch.manual_seed(0)
        save_checkpoint(path, PSATransformer(preset_config("psa-4m", "key-only")), {})
    models["psa-4m (random weights)"] = (path, 1024)
    artifacts = {}
    for name, (ckpt, length) in models.items():
        artifact = out / f"{ckpt.stem}.onnx"
        if not artifact.exists():
            run_export(ExportRequest(ckpt, "onnx", artifact, length))
        artifacts[name] = artifact
    return artifacts


def latency(session: Session, prefix: np.ndarray, token: int, calls: int) -> list[float]:
    times = []
    for _ in range(calls):
        if session.length >= len(prefix) + 50:
            session.reset()
            session.feed(prefix)
        started = time.perf_counter()
        session.feed([token])
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rows = []
    for name, artifact in export_models().items():
        manifest = read_manifest(artifact)
        sessions = {"plain run": Session(OnnxGraph(artifact, manifest, threads=1)),
                    "IO binding": Session(OnnxGraph(artifact, manifest, threads=1,
                                                    io_binding=True))}
        max_len = manifest["max_seq_len"]
        for length in sorted({16, max_len // 4, max_len - 60}):
            prefix = np.random.default_rng(0).integers(0, manifest["config"]["vocab_size"],
                                                       size=length)
            times = {k: [] for k in sessions}
            for s in sessions.values():
                s.reset()
                s.feed(prefix)
            for _ in range(args.calls // 50):
                for label, s in sessions.items():
                    times[label] += latency(s, prefix, 7, 50)
            medians = {k: 1e3 * statistics.median(v) for k, v in times.items()}
            rows.append((name, length, medians["plain run"], medians["IO binding"]))
            print(rows[-1], flush=True)
    table = ["| model | context P | plain run (ms/token) | IO binding (ms/token) | binding / plain |",
             "|---|---|---|---|---|"]
    table += [f"| {n} | {p} | {a:.3f} | {b:.3f} | {b / a:.2f} |" for n, p, a, b in rows]
    faster = sum(b < a for _, _, a, b in rows)
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    verdict = ("IO binding is faster in every case: it is the right default." if faster == len(rows)
               else f"IO binding is faster in {faster} of {len(rows)} cases; plain `run` stays "
                    f"the default (`OnnxGraph(io_binding=True)` opts in).")
    section = (f"Made by `python tools/runtime_bench.py` on {cpu} ({os.cpu_count()} cores, "
               f"{platform.machine()}), ONNX Runtime CPU provider, one intra-op thread, median of "
               f"{args.calls} decode calls per cell.\n\n" + "\n".join(table) + f"\n\n{verdict}\n")
    write_marked_block(REPO / "docs" / "runtime.md", "iobinding", section)
    print(section)


if __name__ == "__main__":
    main()
