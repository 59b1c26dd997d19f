"""What every check shares: the tolerances, the chunk-feeding helper, and the float reference.

Contract:
- Tolerances are relative to the logit scale `max(1, max |logit|)` of the reference on the
  probe: fp32 artifacts FP32_RTOL (docs/reference/spec.md §3); int8 artifacts INT8_RTOL (int4:
  INT4_RTOL) against the reference, plus argmax agreement >= INT8_MIN_AGREEMENT (int4:
  INT4_MIN_AGREEMENT) on the positions the reference has decided (top-2 gap above
  INT8_DECIDED_MARGIN of the scale).
  Speculative greedy equality may diverge only where the target's top-2 margin is below
  TIE_MARGIN.
- `feed_chunks(session, tokens, chunks)` resets a session (any form) and feeds the chunks in
  order; it returns the logits of every position. Every check feeds through it.
- `Reference(model)` is the float reference: the eager fp32 full-sequence forward
  (`logits`), and a session on the eager backend (`session`). `Reference.of_artifact`
  loads the checkpoint an artifact names (its twin when the artifact is one) and refuses one
  whose config differs.
torch is imported only where the eager reference is built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError, SequenceError

FP32_RTOL = 1e-4
# The exporter's int8 bounds, measured on the default model's probe: static int8 has an error of
# ~0.06 of the logit scale and agrees on every position whose top-2 gap exceeds 2% of it; a
# tiny random test model likewise agrees past 5%. They catch a broken build (wrong scales, a
# quantized cache) without failing a sound one on near-ties.
INT8_RTOL = 0.25
# 4-bit weights: random-weight psa-30m's int4 probe errs by 0.31 of the scale (its weights have
# no structure for the blocks' scales to follow); a broken build errs by the whole scale.
INT4_RTOL = 0.5
INT8_DECIDED_MARGIN = 0.05
INT8_MIN_AGREEMENT = 0.95
# 4-bit weights flip some decided positions of a sound build (random psa-4m's XNNPACK int4:
# 0.938 of 64), as quant-check's int4 top-1 floor is 0.90 against int8's 0.98; a broken one
# agrees on almost none (one 4-bit scale per output channel on random psa-30m: 0.017).
INT4_MIN_AGREEMENT = 0.90
TIE_MARGIN = 1e-5


def logit_scale(logits: np.ndarray) -> float:
    return max(1.0, float(np.abs(logits).max()))


def tolerance(reference_logits: np.ndarray, scheme: str | None) -> float:
    """The bound on an artifact's max abs logit error: by its quantization scheme (None: fp32)."""
    rtol = FP32_RTOL if scheme is None else INT4_RTOL if scheme == "int4" else INT8_RTOL
    return rtol * logit_scale(reference_logits)


def min_agreement(scheme: str | None) -> float | None:
    """The floor on a quantized artifact's argmax agreement where the reference is decided, by
    its scheme (None: fp32, which is bound by its logit error alone)."""
    return None if scheme is None else INT4_MIN_AGREEMENT if scheme == "int4" else \
        INT8_MIN_AGREEMENT


def feed_chunks(session, tokens, chunks: list[int]) -> np.ndarray:
    tokens = np.asarray(tokens).reshape(-1)
    if sum(chunks) != tokens.size or min(chunks, default=1) < 1:
        raise SequenceError(f"chunks {chunks} do not split {tokens.size} tokens")
    session.reset()
    session.check(tokens, start=0)
    out, start = [], 0
    for size in chunks:
        out.append(session.feed(tokens[start:start + size]))
        start += size
    return np.concatenate(out)


def random_chunks(rng: np.random.Generator, n: int) -> list[int]:
    cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(1, min(8, n))),
                              replace=False))
    return np.diff(np.concatenate([[0], cuts, [n]])).tolist()


class Reference:
    """The float reference of a model: eager fp32, full sequence."""

    def __init__(self, model, name: str = "reference"):
        self.model, self.name = model.float().eval(), name

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path, twin: bool = False) -> "Reference":
        from psa_edge.model.checkpoint import load_checkpoint
        from psa_edge.model.transformer import twin_of

        model, _ = load_checkpoint(checkpoint)
        return cls(twin_of(model) if twin else model, str(checkpoint))

    @classmethod
    def of_artifact(cls, manifest: dict, checkpoint: str | Path | None = None) -> "Reference":
        """The reference an artifact was exported from (`checkpoint` overrides the path its
        manifest names)."""
        path = Path(checkpoint or (manifest.get("source_checkpoint") or {}).get("checkpoint", ""))
        if not path.is_file():
            raise ArtifactError(f"no reference checkpoint: the artifact's manifest names "
                                f"{str(path)!r}, which does not exist; pass --reference model.pt")
        reference = cls.of_checkpoint(path, twin=bool(manifest.get("twin")))
        if reference.model.cfg.to_dict() != manifest["config"]:
            raise ArtifactError(f"{path} is not the checkpoint the artifact was exported from "
                                f"(its config differs)")
        return reference

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    def logits(self, tokens) -> np.ndarray:
        """`[T, V]` for one sequence, or `[n, T, V]` for a batch `[n, T]`."""
        import torch

        tokens = np.asarray(tokens, dtype=np.int64)
        batch = tokens if tokens.ndim == 2 else tokens[None]
        with torch.no_grad():
            out = np.concatenate([self.model(torch.from_numpy(batch[i:i + 16])).numpy()
                                  for i in range(0, len(batch), 16)])
        return out if tokens.ndim == 2 else out[0]

    def session(self, max_seq_len: int | None = None, twin: bool = False):
        """A session on the eager backend (of the gamma = 0 twin with `twin`)."""
        from psa_edge.backends.eager import EagerGraph
        from psa_edge.model.transformer import twin_of
        from psa_edge.runtime.session import Session

        from psa_edge.model.checkpoint import tokenizer_of

        model = twin_of(self.model) if twin else self.model
        session = Session(EagerGraph(model, self.name + (" (twin)" if twin else ""), max_seq_len))
        session.tokenizer = tokenizer_of(model)
        return session


def open_any(path: str | Path, threads: int | None = None):
    """A session on an artifact folder, or on the eager reference of a checkpoint file."""
    from psa_edge.runtime.session import open_session

    path = Path(path)
    if path.is_file() and path.suffix == ".pt":
        return Reference.of_checkpoint(path).session()
    return open_session(path, threads)
