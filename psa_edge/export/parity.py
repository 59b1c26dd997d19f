"""Parity at export: an artifact against the eager fp32 reference on a probe sequence.

Contract: `probe_parity(...)` runs the probe all at once and token by token through the artifact
(explicit-state graphs through `psa_edge.runtime`, runner-form programs through their
`forward(tokens, input_pos)`), and reports the max abs logit error of each against the eager
full-sequence forward, the logit scale and the tolerance (SPEC §3: 1e-4 relative to the logit
scale for fp32). `passed` is False past tolerance; the exporter then refuses the artifact.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from psa_edge.model.transformer import PSATransformer

PROBE_LEN = 16
FP32_RTOL = 1e-4


def probe_tokens(vocab_size: int, length: int = PROBE_LEN) -> np.ndarray:
    return np.random.default_rng(20260929).integers(0, vocab_size, size=length).astype(np.int64)


def reference_logits(model: PSATransformer, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens)[None])[0].numpy()


def explicit_state_logits(artifact: Path, manifest: dict, tokens: np.ndarray,
                          chunks: list[int]) -> np.ndarray:
    from psa_edge.runtime.decode import decode_chunks
    from psa_edge.runtime.graph import OnnxGraph, PteGraph

    graph_cls = OnnxGraph if manifest["target"] == "onnx" else PteGraph
    logits, _ = decode_chunks(graph_cls(artifact, manifest), tokens, chunks)
    return logits


def runner_logits(artifact: Path, tokens: np.ndarray, chunks: list[int]) -> np.ndarray:
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(str(artifact)).load_method("forward")
    out, start = [], 0
    for size in chunks:
        chunk = torch.from_numpy(tokens[start:start + size])[None]
        out.append(method.execute([chunk, torch.tensor([start], dtype=torch.long)])[0][0].numpy())
        start += size
    return np.concatenate(out)


def probe_parity(model: PSATransformer, artifact: Path, manifest: dict) -> dict:
    tokens = probe_tokens(model.cfg.vocab_size)
    expected = reference_logits(model, tokens)
    run = (runner_logits if manifest["form"] == "runner"
           else lambda a, t, c: explicit_state_logits(a, manifest, t, c))
    scale = float(np.abs(expected).max())
    tolerance = FP32_RTOL * max(1.0, scale)
    errors = {}
    for name, chunks in (("all_at_once", [len(tokens)]), ("token_by_token", [1] * len(tokens))):
        # A fresh runner-form program per probe: its cache buffers live in the loaded method.
        errors[name] = float(np.abs(run(artifact, tokens, chunks) - expected).max())
    return {"probe_len": len(tokens), "max_abs_logit_error": errors, "logit_scale": scale,
            "tolerance": tolerance, "passed": max(errors.values()) <= tolerance}
