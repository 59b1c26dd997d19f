"""`psa-edge verify`: the runtime's invariants (docs/reference/spec.md §3, §5) on an artifact of
either form, against the float reference (PyTorch eager, full-sequence forward of the same
checkpoint, fp32).

Contract: `verify(artifact, reference=None, twin=None)` returns a report of checks, each with
its measured error, tolerance and PASS/FAIL, and a cache-size table:
1. parity: all at once, token by token and random chunkings give the reference logits;
2. prefix reuse: one prefix, snapshotted once and restored for several continuations, gives
   the logits of recomputing prefix + continuation from scratch (and the reference's);
3. rollback: after feeding S proposed tokens of which m are kept, the rolled-back session
   equals a session that only ever saw the m tokens, for m = 0, partial and S: its state
   (caches AND slots) where the session holds it (explicit-state), and the next logits;
4. cache parity: KV-cache bytes of the artifact == its gamma = 0 twin's (the `--twin`
   artifact, else the twin of the reference in the same form) at several lengths up to the
   max; what PSA adds beside the cache is constant in length;
5. greedy speculative decoding equals the target's own greedy decoding with a draft that always
   agrees (the artifact itself) and one that never does; a divergence is accepted only where
   the target's top-2 margin is below TIE_MARGIN, and reported.
`verify(..., started)` reports each of `STAGES` as it begins (the command's progress bar).
Tolerances (`reference.py`): an int8 artifact is compared with the reference within the int8
bound and with itself (reuse, rollback) at fp32 tolerance. The reference is the eager forward of
the checkpoint the manifest names (or `--reference`) where it and torch are present; elsewhere
(a device bundle) the reference's logits on the same probes, recorded at export
(`reference.npz`), and the twin's cache bytes computed from its config. The report names which.
"""

from __future__ import annotations

import zipfile
from dataclasses import asdict, dataclass
from io import BytesIO
from pathlib import Path
from typing import Callable

import numpy as np

from psa_edge.checks.reference import (FP32_RTOL, TIE_MARGIN, Reference, feed_chunks,
                                       logit_scale, random_chunks, tolerance)
from psa_edge.contract import GraphIO, same_architecture
from psa_edge.errors import ArtifactError
from psa_edge.io import artifact_folder
from psa_edge.runtime.generate import generate
from psa_edge.runtime.session import open_session
from psa_edge.runtime.speculative import (SessionDrafter, ShiftedDrafter,
                                          speculative_generate)

REFERENCE = "reference.npz"


@dataclass
class Check:
    name: str
    detail: str
    error: float
    tolerance: float
    passed: bool
    note: str = ""


@dataclass(frozen=True)
class Probes:
    """The sequences verify feeds, a function of the vocabulary and max length alone, so that
    a reference recorded at export (`reference_record`) holds the logits of exactly these."""
    tokens: np.ndarray          # the parity probe
    continuations: np.ndarray   # [4, 8], each after the first half of `tokens`

    @classmethod
    def of(cls, vocab_size: int, max_seq_len: int, seed: int = 0) -> "Probes":
        rng = np.random.default_rng([seed, 0x5E1F])
        tokens = rng.integers(0, vocab_size, size=min(48, max_seq_len))
        return cls(tokens, rng.integers(0, vocab_size, size=(4, 8)))

    @property
    def prefix(self) -> np.ndarray:
        return self.tokens[:len(self.tokens) // 2]


class LiveReference:
    """The eager fp32 forward, computed now."""

    def __init__(self, reference: Reference):
        self.reference, self.name = reference, reference.name

    def probe(self, probes: Probes) -> np.ndarray:
        return self.reference.logits(probes.tokens)

    def continuations(self, probes: Probes) -> list[np.ndarray]:
        return [self.reference.logits(np.concatenate([probes.prefix, c]))[len(probes.prefix):]
                for c in probes.continuations]


class RecordedReference:
    """The eager fp32 forward's logits on the probes, recorded beside the artifact at export
    (`reference.npz`): verify on a device without torch or the checkpoint."""

    def __init__(self, path: Path, vocab_size: int):
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = [data[name] for name in RECORDED]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise ArtifactError(f"{path} is not a readable recorded reference "
                                f"({' '.join(str(exc).split())[:100]})")
        self.tokens, self.logits, self.continuation_tokens, self.continuation_logits = arrays
        if not recorded_shapes_fit(*arrays, vocab_size):
            raise ArtifactError(f"{path} does not hold the logits of a {vocab_size}-token "
                                f"vocabulary on integer probes, all finite")
        self.name = f"the float reference's logits recorded at export ({path.name})"

    def check(self, probes: Probes) -> None:
        if not (np.array_equal(self.tokens, probes.tokens)
                and np.array_equal(self.continuation_tokens, probes.continuations)):
            raise ArtifactError("the recorded reference holds other probes than verify feeds "
                                "(an artifact of an older psa-edge?); export it again")

    def probe(self, probes: Probes) -> np.ndarray:
        self.check(probes)
        return self.logits

    def continuations(self, probes: Probes) -> list[np.ndarray]:
        self.check(probes)
        return list(self.continuation_logits)


RECORDED = ("tokens", "logits", "continuation_tokens", "continuation_logits")


def recorded_shapes_fit(tokens, logits, continuation_tokens, continuation_logits,
                        vocab_size: int) -> bool:
    """Whether a recorded reference's arrays are what `reference_record` writes."""
    integers = all(a.dtype.kind in "iu" for a in (tokens, continuation_tokens))
    floats = all(a.dtype.kind == "f" for a in (logits, continuation_logits))
    return (integers and floats and tokens.ndim == 1 and continuation_tokens.ndim == 2
            and logits.shape == (*tokens.shape, vocab_size)
            and continuation_logits.shape == (*continuation_tokens.shape, vocab_size)
            and bool(np.isfinite(logits).all()) and bool(np.isfinite(continuation_logits).all()))


def reference_record(reference: Reference, vocab_size: int, max_seq_len: int) -> bytes:
    """The probes' reference logits, for `RecordedReference`: the bytes of `REFERENCE`."""
    probes = Probes.of(vocab_size, max_seq_len)
    live = LiveReference(reference)
    arrays = (probes.tokens, live.probe(probes), probes.continuations,
              np.stack(live.continuations(probes)))
    buffer = BytesIO()
    np.savez(buffer, **dict(zip(RECORDED, arrays)))
    return buffer.getvalue()


def check_parity(session, expected, tokens, ref_tol, rng) -> Check:
    plans = [[len(tokens)], [1] * len(tokens)] + [random_chunks(rng, len(tokens))
                                                  for _ in range(3)]
    error = max(float(np.abs(feed_chunks(session, tokens, c) - expected).max()) for c in plans)
    return Check("1. parity", f"{len(tokens)} tokens: all at once, token by token, 3 random "
                 "chunkings vs the full-sequence reference", error, ref_tol, error <= ref_tol)


def check_prefix_reuse(session, probes: Probes, reference, tol, ref_tol) -> Check:
    prefix = probes.prefix
    feed_chunks(session, prefix, [len(prefix)])
    saved = session.snapshot()
    error = ref_error = 0.0
    for continuation, expected in zip(probes.continuations, reference.continuations(probes)):
        session.restore(saved)
        reused = np.concatenate([session.feed(continuation[:3]), session.feed(continuation[3:])])
        whole = np.concatenate([prefix, continuation])
        fresh = feed_chunks(session, whole, [len(whole)])[len(prefix):]
        error = max(error, float(np.abs(reused - fresh).max()))
        ref_error = max(ref_error, float(np.abs(reused - expected).max()))
    return Check("2. prefix reuse", f"prefix of {len(prefix)} saved once, restored for 4 "
                 f"continuations of 8 vs recomputation (vs the reference: {ref_error:.1e}, "
                 f"tolerance {ref_tol:.1e})", error, tol, error <= tol and ref_error <= ref_tol)


def state_of(session) -> dict:
    return {k: v.copy() for k, v in getattr(session, "state", {}).items()}


def check_rollback(session, tokens, tol, rng) -> Check:
    prefix = tokens[:len(tokens) // 2]
    proposed = rng.integers(0, session.io.vocab_size, size=5)
    follow = rng.integers(0, session.io.vocab_size, size=3)
    error = 0.0
    for kept in (0, 2, 5):
        feed_chunks(session, prefix, [len(prefix)])
        session.feed(proposed)
        session.rollback(len(prefix) + kept)
        rolled = state_of(session)
        after = session.feed(follow)
        clean = np.concatenate([prefix, proposed[:kept]])
        feed_chunks(session, clean, [len(clean)])
        error = max([error] + [float(np.abs(rolled[k] - v).max())
                               for k, v in state_of(session).items()])
        error = max(error, float(np.abs(after - session.feed(follow)).max()))
    what = ("state (caches and slots) and next logits" if hasattr(session, "state") else
            "next logits (a static-cache form keeps its caches inside the program)")
    return Check("3. rollback", f"feed 5 proposed tokens, keep 0 / 2 / 5: {what} vs a session "
                 "that never saw the rest", error, tol, error <= tol)


def check_cache_parity(session, twin_sizes, lengths) -> tuple[Check, list[dict]]:
    rows = []
    tokens = np.arange(max(lengths)) % session.io.vocab_size
    for length in lengths:
        feed_chunks(session, tokens[:length], [length])
        psa, twin = session.sizes(), twin_sizes(tokens[:length])
        rows.append({"length": length, "twin_cache_bytes": twin["kv_cache_bytes"],
                     "psa_cache_bytes": psa["kv_cache_bytes"], "extra_bytes": psa["extra_bytes"],
                     "twin_extra_bytes": twin["extra_bytes"],
                     "ratio": psa["kv_cache_bytes"] / twin["kv_cache_bytes"]})
    mismatch = max(abs(r["psa_cache_bytes"] - r["twin_cache_bytes"]) for r in rows)
    constant = len({r["extra_bytes"] for r in rows}) == 1
    return Check("4. cache parity", f"KV-cache bytes == twin's at lengths {lengths}; PSA's extra "
                 f"state constant ({rows[0]['extra_bytes']} bytes)", float(mismatch), 0.0,
                 mismatch == 0 and constant), rows


def check_speculative(artifact: Path, session, tokens) -> Check:
    prompt = tokens[:max(2, len(tokens) // 2)]
    new = min(24, session.io.max_seq_len - len(prompt))
    plain = generate(session, prompt, new)
    logits = feed_chunks(session, np.concatenate([prompt, plain.tokens]),
                         [len(prompt)] + [1] * len(plain.tokens))[len(prompt) - 1:]
    top2 = np.sort(logits, -1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]  # the target's top-2 margin at each greedy step
    vocab = session.io.vocab_size
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


def twin_sizer(session, reference: Reference | None, twin: Path | None):
    """A function tokens -> the twin's state bytes after them: measured on the `--twin`
    artifact's session, or on the reference's eager twin (explicit-state); else computed from
    the twin's config (the runner form's buffers, or a device without the reference)."""
    manifest = session.manifest
    if twin is not None:
        twin_session = open_session(twin)
        cfg = twin_session.manifest["config"]
        if cfg["gamma_q"] or cfg["gamma_k"]:
            raise ArtifactError(f"{twin} is not a gamma = 0 twin")
        if not same_architecture(cfg, manifest["config"]):
            raise ArtifactError(f"{twin} has another config than the artifact (beyond gamma)")
        if twin_session.manifest.get("form") != manifest.get("form"):
            raise ArtifactError(f"{twin} is not of the artifact's form {manifest.get('form')}")
    elif session.io.static_cache or reference is None:
        io = GraphIO.from_config({**manifest["config"], "gamma_q": 0.0, "gamma_k": 0.0},
                                 session.io.max_seq_len, session.io.form)
        return lambda tokens: io.state_bytes(len(tokens))
    else:
        twin_session = reference.session(session.io.max_seq_len, twin=True)
    return lambda tokens: (feed_chunks(twin_session, tokens, [len(tokens)]),
                           twin_session.sizes())[1]


def reference_for(artifact: Path, manifest: dict, checkpoint: Path | None):
    """The eager reference when the checkpoint and torch are here, else the recorded one."""
    recorded = artifact_folder(artifact) / REFERENCE
    source = Path(checkpoint or (manifest.get("source_checkpoint") or {}).get("checkpoint", ""))
    if checkpoint is not None or (source.is_file() and torch_available()):
        eager = Reference.of_artifact(manifest, checkpoint)
        return LiveReference(eager), eager
    if recorded.is_file():
        return RecordedReference(recorded, manifest["config"]["vocab_size"]), None
    raise ArtifactError(f"no reference: the checkpoint {str(source)!r} is not here (or torch "
                        f"is not installed) and the artifact has no {REFERENCE}")


def torch_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # blocked, or a broken installation
        return False


STAGES = ("open", "reference", "parity", "prefix reuse", "rollback", "cache parity",
          "speculative")


def verify(artifact: str | Path, reference: str | Path | None = None,
           twin: str | Path | None = None, seed: int = 0,
           started: Callable[[str], None] = lambda stage: None) -> dict:
    """The report; `started(stage)` as each of `STAGES` begins."""
    artifact = Path(artifact)
    started("open")
    session = open_session(artifact)
    manifest = session.manifest
    started("reference")
    ref, eager = reference_for(artifact, manifest, Path(reference) if reference else None)
    twin_sizes = twin_sizer(session, eager, Path(twin) if twin else None)
    rng = np.random.default_rng(seed)
    probes = Probes.of(session.io.vocab_size, session.io.max_seq_len)
    tokens = probes.tokens
    expected = ref.probe(probes)
    tol = FP32_RTOL * logit_scale(expected)
    ref_tol = tolerance(expected, (manifest.get("quantization") or {}).get("scheme"))
    started("parity")
    checks = [check_parity(session, expected, tokens, ref_tol, rng)]
    started("prefix reuse")
    checks.append(check_prefix_reuse(session, probes, ref, tol, ref_tol))
    started("rollback")
    checks.append(check_rollback(session, tokens, tol, rng))
    started("cache parity")
    max_len = session.io.max_seq_len
    cache_check, cache_rows = check_cache_parity(session, twin_sizes,
                                                 sorted({1, 17, max_len // 2, max_len}))
    started("speculative")
    checks += [cache_check, check_speculative(artifact, session, tokens)]
    return {"artifact": str(artifact), "backend": session.backend, "form": session.io.form,
            "reference": ref.name, "quantization": (manifest.get("quantization")
                                                    or {}).get("scheme", "fp32"),
            "twin": (f"artifact {twin}" if twin else "twin of the reference" if eager
                     else "the twin's config (computed)"),
            "logit_scale": logit_scale(expected), "checks": [asdict(c) for c in checks],
            "cache": cache_rows, "passed": all(c.passed for c in checks)}
