"""Incremental-decoding sessions (docs/reference/spec.md §3-§4); numpy only.

Contract: a session owns one sequence on one artifact: the token ids processed so far, the
logits of the last position, and the state behind them.
- `feed(tokens)` is one graph call over a chunk `[S]` and returns its logits `[S, V]`; with
  `last_only`, those of its last position `[1, V]` (a prefill's: the fused form then computes
  no other row, the other forms compute all S and keep them). A token id outside the
  vocabulary or a chunk past the artifact's max length raises `SequenceError` before anything
  runs; the state is then untouched and the session still usable.
- `rollback(length)` returns to any position from `rollback_floor` on without replaying
  anything; this is the step after a speculative verify. `last_logits` is then None where the
  logits of position length - 1 were not computed or are no longer kept (feed it again).
- `snapshot()` / `restore(snapshot)`: prefix reuse. A snapshot of another artifact is refused.
- `sizes()` reports the KV-cache bytes and what PSA adds beside them (constant in length).
Three kinds; the artifact's registered form names its session and program class per backend
(`contract.GraphForm.sessions`, opened by `open_session`):
- `Session` (explicit-state graphs and the eager reference): the session holds the state. A
  rollback cuts the caches and sets each slot to the raw key (query) of position length-1,
  which the graph returned for the chunk holding it; the raw keys of the recent chunks are kept
  (at least the last, else ROLLBACK_WINDOW positions). A snapshot copies the whole state.
- `RunnerSession` (runner-form programs): the static caches and the raw-key window live in the
  program, so a rollback or a restore only moves the position back: the cache rows before it
  still hold this sequence, and the program takes the slot from its window. A restore is
  refused once the program's cache no longer holds the snapshot's tokens or its window no
  longer reaches back to them.
- `FusedSession` (fused-form graphs): static caches bound once in ONNX Runtime, the slots
  copied from the last raw rows of each call.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from psa_edge.contract import TOKENIZER, GraphIO, State, check_threads, get_form, slots_from
from psa_edge.errors import ArtifactError, PsaEdgeError, SequenceError
from psa_edge.io import read_artifact
from psa_edge.tokenizer import FILES as TOKENIZER_FILES
from psa_edge.tokenizer import Tokenizer, chat_template_of

# Positions of raw keys kept for rollback: more than any draft length; about one cache row each.
ROLLBACK_WINDOW = 64


@dataclass(frozen=True)
class Snapshot:
    identity: str
    tokens: tuple[int, ...]
    last_logits: np.ndarray | None
    state: State | None = None  # a runner-form program keeps its state itself


@dataclass(frozen=True)
class Chunk:
    """What `rollback` needs of one graph call."""
    start: int
    logits: np.ndarray  # of positions logits_from .. start + S - 1
    logits_from: int
    raw: State
    slots_before: object  # the slots before it (fused form: where they come from)
    last_logits_before: np.ndarray | None


class BaseSession:
    def __init__(self, io: GraphIO, manifest: dict, identity: str, backend: str):
        self.io, self.manifest, self.identity, self.backend = io, manifest, identity, backend
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []
        self.last_logits: np.ndarray | None = None

    @property
    def length(self) -> int:
        return len(self.tokens)

    def check(self, tokens, start: int | None = None) -> np.ndarray:
        """The tokens as int64 `[S]`, refused if they cannot be fed at position `start`
        (default: the current length)."""
        start = self.length if start is None else start
        tokens = np.asarray(tokens).reshape(-1)
        vocab = self.io.vocab_size
        if tokens.size == 0:
            raise SequenceError("no tokens to feed")
        if tokens.dtype.kind not in "iu":
            raise SequenceError(f"token ids must be integers, got {tokens.dtype}")
        # As Python ints: a decode step's one token costs a comparison, not numpy's masks.
        ids = tokens.tolist()
        if min(ids) < 0 or max(ids) >= vocab:
            bad = next(t for t in ids if not 0 <= t < vocab)
            raise SequenceError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        if start + tokens.size > self.io.max_seq_len:
            raise SequenceError(f"{start} + {tokens.size} tokens exceed the artifact's "
                                f"max length {self.io.max_seq_len}")
        return tokens.astype(np.int64)

    def check_rollback(self, length: int) -> bool:
        """Whether `length` is reachable (False when it is the current length)."""
        if not self.rollback_floor <= length <= self.length:
            raise SequenceError(f"can roll back to positions {self.rollback_floor}.."
                                f"{self.length}, not to {length}; use a snapshot")
        return length != self.length

    def check_snapshot(self, snapshot: Snapshot) -> None:
        if snapshot.identity != self.identity:
            raise ArtifactError("snapshot was taken on another artifact (sha256 "
                                f"{snapshot.identity[:12]}...), not on this one")


class ChunkedSession(BaseSession):
    """A session whose slots after a rollback come from the raw streams of the chunks it fed
    (explicit-state and fused forms): it keeps the recent chunks (at least the last, else
    ROLLBACK_WINDOW positions)."""

    def reset(self) -> None:
        super().reset()
        self._chunks: list[Chunk] = []

    @property
    def rollback_floor(self) -> int:
        """The earliest position `rollback` can return to."""
        return self._chunks[0].start if self._chunks else self.length

    def record(self, tokens: np.ndarray, logits: np.ndarray, raw: State, slots_before) -> None:
        """Keep a fed chunk and advance the sequence over it."""
        logits_from = self.length + tokens.size - len(logits)
        self._chunks.append(Chunk(self.length, logits, logits_from, raw, slots_before,
                                  self.last_logits))
        while len(self._chunks) > 1 and self.length + tokens.size - self._chunks[1].start \
                >= ROLLBACK_WINDOW:
            del self._chunks[0]
        self.tokens.extend(tokens.tolist())
        self.last_logits = logits[-1]

    def rewind(self, length: int) -> tuple[Chunk, int]:
        """Back to a checked `length`: the chunk that held position length - 1 (or began at
        `length`) and how many of its positions stay (0: none, and the chunk is dropped)."""
        while self._chunks[-1].start >= length and len(self._chunks) > 1:
            self._chunks.pop()
        chunk = self._chunks[-1]
        keep = length - chunk.start
        del self.tokens[length:]
        row = length - 1 - chunk.logits_from
        self.last_logits = (chunk.last_logits_before if keep == 0 else
                            chunk.logits[row] if row >= 0 else None)
        if keep == 0:
            self._chunks.pop()
        return chunk, keep


class Session(ChunkedSession):
    """A sequence over an explicit-state graph (`backends.base.Graph`)."""

    def __init__(self, graph):
        self.graph = graph
        super().__init__(graph.io, graph.manifest, graph.identity, graph.backend)

    def reset(self) -> None:
        super().reset()
        self.state: State = self.io.empty_state()

    def feed(self, tokens, last_only: bool = False) -> np.ndarray:
        tokens = self.check(tokens)
        logits, state, raw = self.graph.step(tokens, self.state)
        self.record(tokens, logits, raw, {k: self.state[k] for k in self.io.slot_keys})
        self.state = state
        return logits[-1:] if last_only else logits

    def rollback(self, length: int) -> None:
        if not self.check_rollback(length):
            return
        chunk, keep = self.rewind(length)
        state = {key: np.ascontiguousarray(self.state[key][:, :, :length])
                 for key, _, _ in self.io.cache_io}
        state.update(chunk.slots_before if keep == 0 else slots_from(chunk.raw, self.io,
                                                                      keep - 1))
        self.state = state

    def snapshot(self) -> Snapshot:
        return Snapshot(self.identity, tuple(self.tokens),
                        None if self.last_logits is None else self.last_logits.copy(),
                        {k: v.copy() for k, v in self.state.items()})

    def restore(self, snapshot: Snapshot) -> None:
        self.check_snapshot(snapshot)
        self.state = {k: v.copy() for k, v in snapshot.state.items()}
        self.tokens = list(snapshot.tokens)
        self.last_logits = snapshot.last_logits
        self._chunks = []

    def sizes(self) -> dict:
        """Bytes of the state now: the KV caches and the slots (measured on the arrays)."""
        cache = sum(self.state[key].nbytes for key, _, _ in self.io.cache_io)
        extra = sum(self.state[key].nbytes for key in self.io.slot_keys)
        return {"length": self.length, "kv_cache_bytes": cache, "extra_bytes": extra,
                "kv_cache_bytes_at_max": self.io.state_bytes(self.io.max_seq_len)
                ["kv_cache_bytes"]}


class RunnerSession(BaseSession):
    """A sequence over a runner-form program (`backends.executorch.RunnerProgram`)."""

    def __init__(self, program):
        self.program = program
        self.cached: list[int] = []  # the token of each program cache row still valid
        self.written = -1            # the highest position written since the last reset
        super().__init__(program.io, program.manifest, program.identity, program.backend)

    def reset(self) -> None:
        super().reset()
        self._logits: dict[int, np.ndarray] = {}  # position -> logits, recent positions only

    def reaches(self, length: int) -> bool:
        """Whether the program's window still holds the raw key of position length - 1 (the
        slot of position `length`): its row is overwritten by a later position of the same
        row."""
        return length == 0 or not self.io.window or length >= self.written - self.io.window + 2

    @property
    def rollback_floor(self) -> int:
        oldest = min(self._logits, default=self.length)  # logits kept for positions >= oldest
        floor = oldest + 1 if oldest > 0 else 0
        while not self.reaches(floor):
            floor += 1
        return floor

    def feed(self, tokens, last_only: bool = False) -> np.ndarray:
        tokens = self.check(tokens)
        start = self.length
        if start == 0:
            self.written = -1
        logits = self.program.run(tokens, start)
        self.tokens.extend(tokens.tolist())
        del self.cached[start:]  # in place: a step costs O(S), not a copy of the sequence
        self.cached.extend(self.tokens[start:])
        self.written = max(self.written, self.length - 1)
        for i, row in enumerate(logits):
            self._logits[start + i] = row
        oldest = self.length - ROLLBACK_WINDOW
        for position in [p for p in self._logits if p < oldest]:
            del self._logits[position]
        self.last_logits = logits[-1]
        return logits[-1:] if last_only else logits

    def rollback(self, length: int) -> None:
        if not self.check_rollback(length):
            return
        del self.tokens[length:]
        self.last_logits = self._logits.get(length - 1)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.identity, tuple(self.tokens),
                        None if self.last_logits is None else self.last_logits.copy())

    def restore(self, snapshot: Snapshot) -> None:
        self.check_snapshot(snapshot)
        length = len(snapshot.tokens)
        if tuple(self.cached[:length]) != snapshot.tokens or not self.reaches(length):
            raise SequenceError("the program's static cache no longer holds this snapshot's "
                                "tokens (a runner-form program keeps one sequence); feed them "
                                "again")
        self.tokens = list(snapshot.tokens)
        self.last_logits = snapshot.last_logits
        self._logits = {}

    def sizes(self) -> dict:
        """Bytes of the program's state (static: allocated at the max length from the start),
        from its buffers as exported."""
        return {"length": self.length, **self.io.state_bytes(self.length),
                "kv_cache_bytes_at_max": self.io.state_bytes(self.io.max_seq_len)
                ["kv_cache_bytes"]}


class FusedSession(ChunkedSession):
    """A sequence over a fused-form graph (`backends.onnxruntime.FusedProgram`): its static
    caches live in the program, the slots are bound to it, the raw streams of recent chunks are
    kept here (as `Session` keeps them) and decide the slots after a rollback."""

    def __init__(self, program):
        self.program = program
        super().__init__(program.io, program.manifest, program.identity, program.backend)

    def reset(self) -> None:
        super().reset()
        # Where the next slots come from: (raw chunk, row), (slots, None), or (None, None) for
        # the zero slots. A chunk's `slots_before` holds the source before it.
        self._slot_source: tuple[State | None, int | None] = (None, None)
        self.program.set_slots(self.slots())

    def slots(self) -> State:
        """The slots of the next position: a row of a kept raw chunk, given slots, or zeros."""
        state, row = self._slot_source
        if state is None:
            return {key: np.zeros(self.io.shape(key.split(".")[1], 1), np.float32)
                    for key in self.io.slot_keys}
        return dict(state) if row is None else slots_from(state, self.io, row)

    def feed(self, tokens, last_only: bool = False) -> np.ndarray:
        tokens = self.check(tokens)
        logits, raw = self.program.run(tokens, self.length, last_only)
        self.record(tokens, logits, raw, self._slot_source)
        self._slot_source = (raw, -1)
        return logits

    def rollback(self, length: int) -> None:
        if not self.check_rollback(length):
            return
        chunk, keep = self.rewind(length)
        self._slot_source = (chunk.raw, keep - 1) if keep else chunk.slots_before
        self.program.set_slots(self.slots())

    def snapshot(self) -> Snapshot:
        rows = {key: cache[:, :, :self.length].copy()
                for key, cache in self.program.caches.items()}
        return Snapshot(self.identity, tuple(self.tokens),
                        None if self.last_logits is None else self.last_logits.copy(),
                        {**rows, **self.slots()})

    def restore(self, snapshot: Snapshot) -> None:
        self.check_snapshot(snapshot)
        for key, cache in self.program.caches.items():
            cache[:, :, :len(snapshot.tokens)] = snapshot.state[key]
        self._chunks = []
        self._slot_source = ({k: snapshot.state[k].copy() for k in self.io.slot_keys}, None)
        self.program.set_slots(self.slots())
        self.tokens = list(snapshot.tokens)
        self.last_logits = snapshot.last_logits

    def sizes(self) -> dict:
        """Bytes of the program's state (static: allocated at the max length from the start)."""
        return {"length": self.length, **self.io.state_bytes(self.length),
                "kv_cache_bytes_at_max": self.io.state_bytes(self.io.max_seq_len)
                ["kv_cache_bytes"]}


def open_session(artifact: str | Path, threads: int | None = None, checked: bool = True,
                 profile_prefix: str | None = None, takes_turns: bool = False):
    """A session on an artifact folder, its backend and kind chosen from its manifest, with the
    artifact's tokenizer as `session.tokenizer`. Bytes this machine has not opened before are
    first opened and self-checked in a child process (`guard.ensure_checked`). ONNX Runtime's
    profiler writes to `profile_prefix` when one is given. `takes_turns`: the session alternates
    with another of this process (ONNX Runtime's pool then stops spinning after each call;
    ExecuTorch's threadpool is one per process already)."""
    from psa_edge.runtime.guard import ensure_checked

    check_threads(threads)
    opened = read_artifact(artifact)
    if checked:
        ensure_checked(opened)
    # The manifest was checked by read_artifact: a registered form, a target that builds it.
    session_class, program_class = get_form(opened.manifest["form"]).opener(
        opened.manifest["backend"], str(opened.folder))
    session = session_class(program_class(opened, threads, profile_prefix, takes_turns))
    try:
        text = opened.read(TOKENIZER).decode("utf-8")
    except UnicodeDecodeError:
        raise ArtifactError(f"{opened.path(TOKENIZER)} is not text")
    config = TOKENIZER_FILES[1]  # tokenizer_config.json: the chat template, where there is one
    template = (chat_template_of(opened.read(config), opened.path(config))
                if config in opened.manifest["files"] else None)
    session.tokenizer = Tokenizer(text, template)
    return session


def checked_open_child(folder: str, identity: str) -> int:
    """The child of `guard.ensure_checked`: open and self-check; exit 2 with one line if not."""
    from psa_edge.runtime.guard import self_check

    try:
        session = open_session(folder, checked=False)
        if session.identity != identity:
            raise ArtifactError(f"{folder} changed while it was being opened")
        self_check(session)
    except PsaEdgeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - whatever a corrupt program makes the runtime do
        print(f"error: {folder} cannot run ({type(exc).__name__}: {str(exc)[:160]})",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(checked_open_child(*sys.argv[1:3]))
