"""Feeding a sequence through an explicit-state graph in chunks (numpy only).

Contract: `decode_chunks(graph, tokens, chunks)` starts from the empty state, feeds the chunks
in order, and returns the logits of every position `[T, V]` and the final state (dict
"layer.field" -> array). Token ids and lengths are checked before anything runs.
"""

from __future__ import annotations

import numpy as np

from psa_edge.errors import SequenceError
from psa_edge.runtime.graph import Graph


def check_tokens(graph: Graph, tokens: np.ndarray, past_len: int = 0) -> None:
    spec = graph.spec
    if tokens.size and (tokens.min() < 0 or tokens.max() >= spec.vocab_size):
        bad = int(tokens[(tokens < 0) | (tokens >= spec.vocab_size)][0])
        raise SequenceError(f"token id {bad} is outside the vocabulary [0, {spec.vocab_size})")
    if past_len + tokens.size > spec.max_seq_len:
        raise SequenceError(f"sequence of {past_len + tokens.size} tokens is longer than the "
                            f"artifact's max length {spec.max_seq_len}")


def step(graph: Graph, tokens: np.ndarray, state: dict[str, np.ndarray]
         ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One graph call: logits `[S, V]`, the new state and the raw keys/queries of the chunk."""
    spec = graph.spec
    past_len = state["0.key"].shape[2]
    check_tokens(graph, tokens, past_len)
    feeds = {"input_ids": tokens.reshape(1, -1).astype(np.int64)}
    feeds.update((name_in, state[key]) for key, name_in, _ in spec.state_io)
    out = graph.run(feeds)
    new_state = {key: out[name_out] for key, _, name_out in spec.state_io}
    raw = {key: out[name_out] for key, name_out in spec.raw_io}
    return out["logits"][0], new_state, raw


def decode_chunks(graph: Graph, tokens: np.ndarray, chunks: list[int]
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if sum(chunks) != tokens.size or min(chunks, default=1) < 1:
        raise SequenceError(f"chunks {chunks} do not split {tokens.size} tokens")
    check_tokens(graph, tokens)
    state, logits, start = graph.spec.empty_state(), [], 0
    for size in chunks:
        chunk_logits, state, _ = step(graph, tokens[start:start + size], state)
        logits.append(chunk_logits)
        start += size
    return np.concatenate(logits), state
