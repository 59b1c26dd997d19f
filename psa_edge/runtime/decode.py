"""Feeding a whole sequence through a graph in given chunks (numpy only).

Contract: `decode_chunks(graph, tokens, chunks)` starts a fresh `Session` on the graph, feeds
the chunks in order, and returns the logits of every position `[T, V]` and the final state
(dict "layer.field" -> array). Token ids and lengths are checked before anything runs.
"""

from __future__ import annotations

import numpy as np

from psa_edge.errors import SequenceError
from psa_edge.runtime.graph import Graph, State
from psa_edge.runtime.session import Session


def decode_chunks(graph: Graph, tokens, chunks: list[int]) -> tuple[np.ndarray, State]:
    tokens = np.asarray(tokens).reshape(-1)
    if sum(chunks) != tokens.size or min(chunks, default=1) < 1:
        raise SequenceError(f"chunks {chunks} do not split {tokens.size} tokens")
    session = Session(graph)
    session.check(tokens, start=0)
    logits, start = [], 0
    for size in chunks:
        logits.append(session.feed(tokens[start:start + size]))
        start += size
    return np.concatenate(logits), session.state
