"""Parity at export: an artifact against the eager fp32 reference on a probe sequence.

Contract: `expected_logits(reference, held_out, max_len)` computes the eager reference's
side first (the probe and its logits), so that the exporter can free the eager weights before
the artifact is opened; `probe_parity(expected, artifact_folder)` opens the exporter's own new
artifact as a device would (`runtime.open_session`, either form; being this machine's own
output, without the first-open child process of `runtime.guard`), feeds the probe all at once
and token by token, and reports the max abs logit error and the argmax agreement of each
against the reference's full-sequence forward, and the logit scale.
- fp32 artifacts: a PROBE_LEN random probe; pass within `reference.FP32_RTOL` of the logit
  scale (docs/reference/spec.md §3).
- int8 artifacts: an INT8_PROBE_LEN held-out sequence of the export's task (random tokens
  give a trained model nothing to be sure of); pass within `reference.INT8_RTOL` (int4:
  `INT4_RTOL`) of the scale, with argmax agreement >= INT8_MIN_AGREEMENT (int4:
  INT4_MIN_AGREEMENT) on the positions the reference has decided. At a near-tie any rounding
  may flip the argmax; that is not a broken build, a flip where the reference is decided is.
  Agreement over all positions is reported.
`passed` is False otherwise; the exporter then refuses the artifact. `self_check` is the
artifact's own fingerprint on a few tokens, which a later first open compares (`runtime.guard`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from psa_edge.checks.reference import (INT8_DECIDED_MARGIN, Reference, feed_chunks,
                                       logit_scale, min_agreement, tolerance)

PROBE_LEN = 16
INT8_PROBE_LEN = 128
PROBE_SEED = 20260929


def probe_tokens(vocab_size: int, length: int = PROBE_LEN) -> np.ndarray:
    return np.random.default_rng(PROBE_SEED).integers(0, vocab_size, size=length).astype(np.int64)


def int8_probe_tokens(task, max_len: int) -> np.ndarray:
    tokens, _ = task.sample("test", 1, seed=PROBE_SEED)
    return tokens[0, :min(INT8_PROBE_LEN, max_len)]


@dataclass(frozen=True)
class Expected:
    """The probe of a parity check and the eager reference's full-sequence logits on it."""
    tokens: np.ndarray  # [T]
    logits: np.ndarray  # [T, V]


def expected_logits(reference: Reference, held_out, max_len: int) -> Expected:
    """The probe of a float export (random tokens), or of a quantized one (a held-out sequence
    of `held_out`, the export's task), and the reference's logits on it."""
    tokens = (int8_probe_tokens(held_out, max_len) if held_out is not None
              else probe_tokens(reference.vocab_size))
    return Expected(tokens, reference.logits(tokens))


def probe_parity(expected: Expected, folder: Path) -> dict:
    from psa_edge.io import read_artifact
    from psa_edge.runtime.guard import mark_checked, self_check_record
    from psa_edge.runtime.session import open_session

    mark_checked(read_artifact(folder).identity)
    session = open_session(folder)
    manifest = session.manifest
    int8 = manifest.get("quantization") is not None
    tokens, expected = expected.tokens, expected.logits
    scheme = (manifest.get("quantization") or {}).get("scheme")
    scale, limit = logit_scale(expected), tolerance(expected, scheme)
    top2 = np.sort(expected, -1)[:, -2:]
    decided = (top2[:, 1] - top2[:, 0]) > INT8_DECIDED_MARGIN * scale
    errors, agreement, decided_agreement = {}, {}, {}
    for name, chunks in (("all_at_once", [len(tokens)]), ("token_by_token", [1] * len(tokens))):
        logits = feed_chunks(session, tokens, chunks)
        errors[name] = float(np.abs(logits - expected).max())
        same = logits.argmax(-1) == expected.argmax(-1)
        agreement[name] = float(same.mean())
        decided_agreement[name] = float(same[decided].mean()) if decided.any() else 1.0
    passed = max(errors.values()) <= limit
    floor = min_agreement(scheme)
    if int8:
        passed = passed and min(decided_agreement.values()) >= floor
    return {"probe_len": len(tokens), "kind": "int8" if int8 else "fp32",
            "max_abs_logit_error": errors, "argmax_agreement": agreement,
            "decided_positions": int(decided.sum()),
            "decided_argmax_agreement": decided_agreement if int8 else None,
            "logit_scale": scale, "tolerance": limit,
            "min_agreement": floor, "passed": passed,
            "self_check": self_check_record(session)}


def failure_message(parity: dict) -> str:
    worst = max(parity["max_abs_logit_error"].values())
    text = (f"parity check failed: max abs logit error {worst:.3g} (tolerance "
            f"{parity['tolerance']:.3g})")
    if parity["min_agreement"] is not None:
        worst_agreement = min(parity["decided_argmax_agreement"].values())
        text += (f", argmax agreement on {parity['decided_positions']} decided positions "
                 f"{worst_agreement:.3f} (needs >= {parity['min_agreement']})")
    return text + "; no artifact written"
