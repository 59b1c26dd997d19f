"""Incremental-decoding sessions over an explicit-state graph (SPEC §3-4); numpy only.

Contract: a `Session` owns the state of one sequence on one graph: the KV caches (sheared keys
and values), the previous-key (and previous-query) slots, the token ids processed so far and
the logits of the last position.
- `feed(tokens)` is one graph call over a chunk `[S]` and returns its logits `[S, V]`. A token
  id outside the vocabulary or a chunk past the artifact's max length raises `SequenceError`
  before anything runs; the state is then untouched and the session still usable.
- `rollback(length)` returns to any position from `rollback_floor` on without replaying
  anything: the caches are cut and each slot is set to the raw key (query) of position
  length-1, which the graph returned for the chunk holding it. The session keeps the raw keys of
  its recent chunks (at least the last one, else ROLLBACK_WINDOW positions). This is the step
  after a speculative verify, and lets a draft session drop rejected proposals. Earlier
  positions are reached with snapshots.
- `snapshot()` / `restore(snapshot)` copy the whole state (caches, slots, tokens, last logits).
  A snapshot taken on another artifact is refused (`ArtifactError`).
- `sizes()` reports the KV-cache bytes (now and at the artifact's max length) and the slot
  bytes, which do not depend on the length (SPEC §3, invariant 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError, SequenceError
from psa_edge.runtime.graph import Graph, GraphSpec, State, open_graph, slots_from

# Positions of raw keys kept for rollback: more than any draft length; about one cache row each.
ROLLBACK_WINDOW = 64


@dataclass(frozen=True)
class Snapshot:
    artifact_sha256: str
    state: State
    tokens: tuple[int, ...]
    last_logits: np.ndarray | None


@dataclass(frozen=True)
class Chunk:
    """What `rollback` needs of one graph call."""
    start: int
    logits: np.ndarray
    raw: State
    slots_before: State
    last_logits_before: np.ndarray | None


class Session:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.spec: GraphSpec = graph.spec
        self.identity = graph.manifest.get("artifact_sha256", "")
        self.reset()

    def reset(self) -> None:
        self.state: State = self.spec.empty_state()
        self.tokens: list[int] = []
        self.last_logits: np.ndarray | None = None
        self._chunks: list[Chunk] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def rollback_floor(self) -> int:
        """The earliest position `rollback` can return to."""
        return self._chunks[0].start if self._chunks else self.length

    def check(self, tokens, start: int | None = None) -> np.ndarray:
        """The tokens as int64 `[S]`, refused if they cannot be fed at position `start`
        (default: the current length)."""
        start = self.length if start is None else start
        tokens = np.asarray(tokens).reshape(-1)
        vocab = self.spec.vocab_size
        if tokens.size == 0:
            raise SequenceError("no tokens to feed")
        if not np.issubdtype(tokens.dtype, np.integer):
            raise SequenceError(f"token ids must be integers, got {tokens.dtype}")
        bad = tokens[(tokens < 0) | (tokens >= vocab)]
        if bad.size:
            raise SequenceError(f"token id {int(bad[0])} is outside the vocabulary [0, {vocab})")
        if start + tokens.size > self.spec.max_seq_len:
            raise SequenceError(f"{start} + {tokens.size} tokens exceed the artifact's "
                                f"max length {self.spec.max_seq_len}")
        return tokens.astype(np.int64)

    def feed(self, tokens) -> np.ndarray:
        tokens = self.check(tokens)
        logits, state, raw = self.graph.step(tokens, self.state)
        # Slots are views of earlier raw outputs, never of IO-binding buffers: kept uncopied.
        slots = {k: self.state[k] for k in self.spec.slot_keys}
        self._chunks.append(Chunk(self.length, logits, raw, slots, self.last_logits))
        while len(self._chunks) > 1 and self.length + tokens.size - self._chunks[1].start \
                >= ROLLBACK_WINDOW:
            del self._chunks[0]
        self.state = state
        self.tokens.extend(int(t) for t in tokens)
        self.last_logits = logits[-1]
        return logits

    def rollback(self, length: int) -> None:
        if not self.rollback_floor <= length <= self.length:
            raise SequenceError(f"can roll back to positions {self.rollback_floor}.."
                                f"{self.length}, not to {length}; use a snapshot")
        if length == self.length:
            return
        while self._chunks[-1].start >= length and len(self._chunks) > 1:
            self._chunks.pop()
        chunk = self._chunks[-1]
        keep = length - chunk.start  # positions of that chunk that stay (0: none of it)
        state = {key: np.ascontiguousarray(self.state[key][:, :, :length])
                 for key, _, _ in self.spec.cache_io}
        state.update(chunk.slots_before if keep == 0 else slots_from(chunk.raw, self.spec,
                                                                      keep - 1))
        self.state = state
        del self.tokens[length:]
        self.last_logits = chunk.logits[keep - 1] if keep else chunk.last_logits_before
        if keep == 0:
            self._chunks.pop()

    def snapshot(self) -> Snapshot:
        return Snapshot(self.identity, {k: v.copy() for k, v in self.state.items()},
                        tuple(self.tokens),
                        None if self.last_logits is None else self.last_logits.copy())

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.artifact_sha256 != self.identity:
            raise ArtifactError("snapshot was taken on another artifact (sha256 "
                                f"{snapshot.artifact_sha256[:12]}...), not on this one")
        self.state = {k: v.copy() for k, v in snapshot.state.items()}
        self.tokens = list(snapshot.tokens)
        self.last_logits = snapshot.last_logits
        self._chunks = []

    def sizes(self) -> dict:
        """Bytes of the state: caches now and at the max length, and the constant slots."""
        spec = self.spec
        cache_now = sum(v.nbytes for k, v in self.state.items()
                        if k.split(".")[1] in ("key", "value"))
        per_position = sum(4 * int(np.prod(spec.shape(k.split(".")[1], 1)))
                           for k in self.state if k.split(".")[1] in ("key", "value"))
        slots = sum(self.state[k].nbytes for k in spec.slot_keys)
        return {"length": self.length, "max_seq_len": spec.max_seq_len,
                "kv_cache_bytes": cache_now,
                "kv_cache_bytes_at_max": per_position * spec.max_seq_len,
                "slot_bytes": slots, "dtype": "float32"}


def open_session(artifact: str | Path, threads: int | None = None) -> Session:
    """A session on an artifact (.onnx, .pte) or a checkpoint (model.pt: the eager backend),
    the backend chosen from its manifest."""
    return Session(open_graph(artifact, threads))
