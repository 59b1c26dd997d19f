"""`psa-edge bench --profile`: where a decoded token's time goes on ONNX Runtime (numpy and
onnxruntime only).

Contract: `profile_decode(artifact, spec)` opens the artifact with ONNX Runtime's profiler on,
feeds a `spec.prompt`-token prompt (not counted), then decodes `spec.gen` tokens one call each,
and reports per decoded token: the wall time of `session.feed`, the time inside ONNX Runtime's
run (its `model_run` events), what lies outside it (psa-edge's Python, the I/O binding), and the
kernel time of each operator type (its `Node` events), largest first. The profiler's own
bookkeeping adds a little to every node, so the kernel times are upper bounds; compare them with
each other and with the unprofiled tokens/s of `psa-edge bench`. A `.pte` has no such profiler
here: `ArtifactError`.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError
from psa_edge.io import read_artifact


def profile_decode(artifact: Path, spec) -> dict:
    from psa_edge.runtime.session import open_session

    manifest = read_artifact(artifact, check_hash=False).manifest
    if manifest.get("backend") != "onnxruntime":
        raise ArtifactError(f"--profile reads ONNX Runtime's profiler; {artifact} is a "
                            f"{manifest.get('backend')} artifact")
    if spec.prompt + spec.gen > manifest["max_seq_len"]:
        raise ArtifactError(f"p {spec.prompt} + n {spec.gen} exceed the artifact's max length "
                            f"{manifest['max_seq_len']}")
    with tempfile.TemporaryDirectory() as folder:
        session = open_session(artifact, spec.threads, profile_prefix=str(Path(folder) / "ort"))
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, session.io.vocab_size, size=spec.prompt + spec.gen)
        session.feed(tokens[:spec.prompt], last_only=True)
        wall = []
        for i in range(spec.prompt, tokens.size):
            started = time.perf_counter()
            session.feed(tokens[i:i + 1])
            wall.append(time.perf_counter() - started)
        ort_session = (session.program if hasattr(session, "program") else session.graph).session
        events = json.loads(Path(ort_session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    decode = runs[-spec.gen:]
    first = decode[0]["ts"]
    kernels = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first:
            kernels[e["args"]["op_name"]] += e["dur"]
    n = spec.gen
    wall_us = 1e6 * statistics.mean(wall)
    run_us = statistics.mean(e["dur"] for e in decode)
    return {"artifact": str(artifact), "form": manifest.get("form"),
            "precision": (manifest.get("quantization") or {}).get("scheme", "fp32"),
            "threads": spec.threads, "context": spec.prompt, "decode_tokens": n,
            "wall_us_per_token": wall_us, "ort_run_us_per_token": run_us,
            "outside_ort_us_per_token": wall_us - run_us,
            "kernel_us_per_token": {op: us / n for op, us in kernels.most_common()},
            "nodes_per_token": sum(1 for e in events if e.get("cat") == "Node"
                                   and e["name"].endswith("_kernel_time")
                                   and e["ts"] >= first) / n}
