"""`psa-edge verify`: the runtime's invariants (SPEC §3-4) on an artifact, against the float
reference (PyTorch eager, full-sequence forward of the same checkpoint, fp32).

Contract: `verify(artifact, reference=None, twin=None)` returns a report of checks, each with
its measured error, tolerance and PASS/FAIL, and a cache-size table:
1. parity: all at once, token by token and random chunkings give the reference logits;
2. prefix reuse: one prefix state, snapshotted once and restored for several continuations,
   gives the logits of recomputing prefix + continuation from scratch (and the reference's);
3. rollback: after feeding S proposed tokens of which m are kept, the rolled-back state
   (caches AND slots) equals the state of a session that only ever saw the m tokens, for
   m = 0, partial and S; the next logits agree too;
4. cache parity: KV-cache bytes of the artifact == its gamma = 0 twin's (the `--twin` artifact,
   else the eager twin) at several lengths up to the max; slot bytes constant;
5. greedy speculative decoding equals the target's own greedy decoding with a draft that always
   agrees (the artifact itself) and one that never does; a divergence is accepted only where
   the target's top-2 margin is below 1e-5, and reported.
Tolerance: fp32 artifacts 1e-4 x max(1, logit scale) (SPEC §3); an int8 artifact is compared
with the reference within the int8 export bound and with itself (reuse, rollback) at fp32
tolerance. The reference checkpoint defaults to the one the manifest names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError
from psa_edge.runtime.generate import generate
from psa_edge.runtime.graph import same_architecture
from psa_edge.runtime.session import Session, open_session
from psa_edge.runtime.speculative import (SessionDrafter, ShiftedDrafter,
                                          speculative_generate)

FP32_RTOL = 1e-4
INT8_RTOL = 0.25  # the exporter's int8 bound (psa_edge.export.parity.INT8_MAX_REL_ERROR)
TIE_MARGIN = 1e-5


@dataclass
class Check:
    name: str
    detail: str
    error: float
    tolerance: float
    passed: bool
    note: str = ""


def reference_graph(artifact: Path, manifest: dict, reference: Path | None):
    from psa_edge.model.checkpoint import load_checkpoint
    from psa_edge.model.transformer import twin_of
    from psa_edge.export.eager import EagerGraph

    path = Path(reference or manifest.get("source_checkpoint", {}).get("checkpoint", ""))
    if not path.is_file():
        raise ArtifactError(f"no reference checkpoint: {artifact.name}'s manifest names "
                            f"{str(path)!r}, which does not exist; pass --reference model.pt")
    model, _ = load_checkpoint(path)
    if manifest.get("twin"):
        model = twin_of(model)
    if model.cfg.to_dict() != manifest["config"]:
        raise ArtifactError(f"{path} is not the checkpoint {artifact.name} was exported from "
                            f"(its config differs)")
    return EagerGraph.from_model(model, str(path), manifest["max_seq_len"]), model


def full_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(tokens, np.int64))[None])[0].numpy()


def feed_chunks(session: Session, tokens: np.ndarray, chunks: list[int]) -> np.ndarray:
    session.reset()
    out, start = [], 0
    for size in chunks:
        out.append(session.feed(tokens[start:start + size]))
        start += size
    return np.concatenate(out)


def random_chunks(rng, n: int) -> list[int]:
    cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(1, 8)), replace=False))
    return np.diff(np.concatenate([[0], cuts, [n]])).tolist()


def check_parity(session, model, tokens, tol, ref_tol, rng) -> Check:
    expected = full_logits(model, tokens)
    plans = [[len(tokens)], [1] * len(tokens)] + [random_chunks(rng, len(tokens))
                                                  for _ in range(3)]
    error = max(float(np.abs(feed_chunks(session, tokens, c) - expected).max()) for c in plans)
    return Check("1. parity", f"{len(tokens)} tokens: all at once, token by token, 3 random "
                 "chunkings vs the full-sequence reference", error, ref_tol, error <= ref_tol)


def check_prefix_reuse(session, model, tokens, tol, ref_tol, rng) -> Check:
    prefix, vocab = tokens[:len(tokens) // 2], session.spec.vocab_size
    session.reset()
    session.feed(prefix)
    saved = session.snapshot()
    error = ref_error = 0.0
    for _ in range(4):
        continuation = rng.integers(0, vocab, size=8)
        session.restore(saved)
        reused = np.concatenate([session.feed(continuation[:3]), session.feed(continuation[3:])])
        fresh = feed_chunks(session, np.concatenate([prefix, continuation]),
                            [len(prefix) + len(continuation)])[len(prefix):]
        reference = full_logits(model, np.concatenate([prefix, continuation]))[len(prefix):]
        error = max(error, float(np.abs(reused - fresh).max()))
        ref_error = max(ref_error, float(np.abs(reused - reference).max()))
    return Check("2. prefix reuse", f"prefix of {len(prefix)} saved once, restored for 4 "
                 f"continuations of 8 vs recomputation (vs the reference: {ref_error:.1e}, "
                 f"tolerance {ref_tol:.1e})", error, tol, error <= tol and ref_error <= ref_tol)


def check_rollback(session, model, tokens, tol, ref_tol, rng) -> Check:
    prefix = tokens[:len(tokens) // 2]
    proposed = rng.integers(0, session.spec.vocab_size, size=5)
    follow = rng.integers(0, session.spec.vocab_size, size=3)
    error = 0.0
    for kept in (0, 2, 5):
        session.reset()
        session.feed(prefix)
        session.feed(proposed)
        session.rollback(len(prefix) + kept)
        rolled = {k: v.copy() for k, v in session.state.items()}
        after = session.feed(follow)
        clean = np.concatenate([prefix, proposed[:kept]])
        feed_chunks(session, clean, [len(clean)])
        error = max([error] + [float(np.abs(rolled[k] - v).max()) for k, v in
                               session.state.items()])
        error = max(error, float(np.abs(after - session.feed(follow)).max()))
    return Check("3. rollback", "feed 5 proposed tokens, keep 0 / 2 / 5: state (caches and "
                 "slots) and next logits vs a session that never saw the rest", error, tol,
                 error <= tol)


def check_cache_parity(session, twin_session, lengths) -> tuple[Check, list[dict]]:
    rows = []
    tokens = np.arange(max(lengths)) % session.spec.vocab_size
    for length in lengths:
        for s in (session, twin_session):
            s.reset()
            s.feed(tokens[:length])
        psa, twin = session.sizes(), twin_session.sizes()
        rows.append({"length": length, "twin_cache_bytes": twin["kv_cache_bytes"],
                     "psa_cache_bytes": psa["kv_cache_bytes"], "slot_bytes": psa["slot_bytes"],
                     "twin_slot_bytes": twin["slot_bytes"],
                     "ratio": psa["kv_cache_bytes"] / twin["kv_cache_bytes"]})
    mismatch = max(abs(r["psa_cache_bytes"] - r["twin_cache_bytes"]) for r in rows)
    slots_constant = len({r["slot_bytes"] for r in rows}) == 1
    return Check("4. cache parity", f"KV-cache bytes == twin's at lengths {lengths}; slot "
                 f"bytes constant ({rows[0]['slot_bytes']})", float(mismatch), 0.0,
                 mismatch == 0 and slots_constant), rows


def check_speculative(artifact: Path, session: Session, tokens) -> Check:
    prompt = tokens[:max(2, len(tokens) // 2)]
    new = min(24, session.spec.max_seq_len - len(prompt))
    plain = generate(session, prompt, new)
    margins = []
    session.reset()
    session.feed(prompt)
    for token in plain.tokens[:-1]:  # the target's top-2 margin at each greedy step
        top2 = np.sort(session.last_logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        session.feed([token])
    top2 = np.sort(session.last_logits)[-2:]
    margins.append(float(top2[1] - top2[0]))
    vocab = session.spec.vocab_size
    notes, worst = [], 0
    for label, drafter in (("agreeing", SessionDrafter(open_session(artifact), vocab)),
                           ("never agreeing", ShiftedDrafter(
                               SessionDrafter(open_session(artifact), vocab), vocab))):
        spec = speculative_generate(session, drafter, prompt, new, draft_len=4)
        diverged = next((i for i, (a, b) in enumerate(zip(spec.tokens, plain.tokens))
                         if a != b), None)
        if diverged is not None:
            tie = margins[diverged] < TIE_MARGIN
            notes.append(f"{label} draft diverged at step {diverged} (margin "
                         f"{margins[diverged]:.1e}{', a tie: accepted' if tie else ''})")
            worst = max(worst, 0 if tie else 1)
        notes.append(f"{label}: acceptance {spec.stats['acceptance_rate']:.2f}, "
                     f"{spec.stats['tokens_per_target_call']:.2f} tokens per target call")
    return Check("5. speculative (greedy)", f"{new} tokens with an agreeing and a never-agreeing "
                 "draft == the target's own greedy tokens", float(worst), 0.0, worst == 0,
                 "; ".join(notes))


def verify(artifact: str | Path, reference: str | Path | None = None,
           twin: str | Path | None = None, seed: int = 0) -> dict:
    artifact = Path(artifact)
    session = open_session(artifact)
    manifest = session.graph.manifest
    graph, model = reference_graph(artifact, manifest, reference)
    if twin is not None:
        twin_session = open_session(twin)
        twin_cfg = twin_session.graph.manifest["config"]
        if twin_cfg["gamma_q"] or twin_cfg["gamma_k"]:
            raise ArtifactError(f"{Path(twin).name} is not a gamma = 0 twin")
        if not same_architecture(twin_cfg, manifest["config"]):
            raise ArtifactError(f"{Path(twin).name} has another config than {artifact.name} "
                                f"(beyond gamma)")
    else:
        from psa_edge.model.transformer import twin_of
        from psa_edge.export.eager import EagerGraph

        twin_session = Session(EagerGraph.from_model(twin_of(model), "twin",
                                                     manifest["max_seq_len"]))
    rng = np.random.default_rng(seed)
    length = min(48, session.spec.max_seq_len)
    tokens = rng.integers(0, session.spec.vocab_size, size=length)
    scale = max(1.0, float(np.abs(full_logits(model, tokens)).max()))
    int8 = manifest.get("quantization") is not None
    tol, ref_tol = FP32_RTOL * scale, (INT8_RTOL if int8 else FP32_RTOL) * scale
    checks = [check_parity(session, model, tokens, tol, ref_tol, rng),
              check_prefix_reuse(session, model, tokens, tol, ref_tol, rng),
              check_rollback(session, model, tokens, tol, ref_tol, rng)]
    max_len = session.spec.max_seq_len
    cache_check, cache_rows = check_cache_parity(session, twin_session,
                                                 sorted({1, 17, max_len // 2, max_len}))
    checks += [cache_check, check_speculative(artifact, session, tokens)]
    return {"artifact": str(artifact), "backend": session.graph.backend,
            "reference": str(graph.artifact), "quantization": (manifest.get("quantization")
                                                                or {}).get("scheme", "fp32"),
            "twin": "artifact " + str(twin) if twin else "eager twin of the reference",
            "logit_scale": scale, "checks": [asdict(c) for c in checks], "cache": cache_rows,
            "passed": all(c.passed for c in checks)}
