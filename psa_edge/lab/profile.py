"""`psa-edge bench --profile`: where a prefill's and a decoded token's time go on ONNX Runtime
(numpy and onnxruntime only).

Contract: `profile_tokens(artifact, spec)` opens the artifact with ONNX Runtime's profiler on,
prefills a `spec.prompt`-token prompt from an empty cache `spec.reps` times after one warm-up
(the last row's logits only, as `generate` and `bench` prefill), then decodes `spec.gen` tokens
one call each after the last prefill. It reports, per prefill and per decoded token (means):
the wall time of `session.feed`, the time inside ONNX Runtime's runs (their `model_run`
events), what lies outside them (psa-edge's Python, the I/O binding), and the kernel time of
each operator type (its `Node` events), largest first. The profiler's own bookkeeping adds a
little to every node, so the kernel times are upper bounds; compare them with each other and
with the unprofiled tokens/s of `psa-edge bench`. A `.pte` has no such profiler here:
`ArtifactError`.
"""

from __future__ import annotations

import json
import tempfile
from bisect import bisect_right
from collections import Counter
from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError
from psa_edge.io import read_artifact


def profile_tokens(artifact: Path, spec) -> dict:
    from psa_edge.runtime.bench import Runner

    manifest = read_artifact(artifact, check_hash=False).manifest
    if manifest.get("backend") != "onnxruntime":
        raise ArtifactError(f"--profile reads ONNX Runtime's profiler; {artifact} is a "
                            f"{manifest.get('backend')} artifact")
    if spec.prompt + spec.gen > manifest["max_seq_len"]:
        raise ArtifactError(f"p {spec.prompt} + n {spec.gen} exceed the artifact's max length "
                            f"{manifest['max_seq_len']}")
    with tempfile.TemporaryDirectory() as folder:
        runner = Runner(artifact, spec.threads, profile_prefix=str(Path(folder) / "ort"))
        session = runner.session
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, session.io.vocab_size, size=spec.prompt + spec.gen)
        no_context = tokens[:0]
        # the first prefill is the warm-up; the tokens decode after the last one
        prefill_wall = [runner.prefill(no_context, tokens[:spec.prompt])
                        for _ in range(spec.reps + 1)]
        decode_wall = runner.steps(tokens, 0, spec.prompt, tokens.size)
        ort_session = (session.program if hasattr(session, "program") else session.graph).session
        events = json.loads(Path(ort_session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    # one run per feed in either form: the warm-up prefill's, the timed ones', the tokens'
    timed, decode = runs[1:spec.reps + 1], runs[spec.reps + 1:]
    return {"artifact": str(artifact), "form": manifest.get("form"),
            "precision": (manifest.get("quantization") or {}).get("scheme", "fp32"),
            "threads": spec.threads, "context": spec.prompt, "decode_tokens": spec.gen,
            "prefill": {"tokens": spec.prompt, "repetitions": spec.reps,
                        **per_item(events, timed, prefill_wall[1:], "prefill")},
            **per_item(events, decode, decode_wall, "token")}


def per_item(events: list[dict], runs: list[dict], wall: list[float], item: str) -> dict:
    """The mean wall, run, outside and per-operator kernel microseconds of an item (a prefill,
    a token) over its `runs`, one per item; `wall` in seconds, one per item."""
    starts = [run["ts"] for run in runs]
    kernels, nodes = Counter(), 0
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        i = bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] <= runs[i]["ts"] + runs[i]["dur"]:
            kernels[e["args"]["op_name"]] += e["dur"]
            nodes += 1
    count = len(runs)
    wall_us = 1e6 * sum(wall) / count
    run_us = sum(run["dur"] for run in runs) / count
    return {f"wall_us_per_{item}": wall_us, f"ort_run_us_per_{item}": run_us,
            f"outside_ort_us_per_{item}": wall_us - run_us,
            f"kernel_us_per_{item}": {op: us / count for op, us in kernels.most_common()},
            f"nodes_per_{item}": nodes / count}
