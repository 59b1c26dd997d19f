"""The interface every explicit-state backend implements (numpy only, no torch).

Contract: a `Graph` has `io` (its `contract.GraphIO`), `manifest`, `identity` (the sha256 of
what it runs, or a name for the eager reference) and `backend`. A backend implements
`run(feeds) -> outputs` over the graph's named inputs and outputs; `step(tokens, state)` maps
a session's state (a dict "layer.field" -> array, docs/reference/spec.md §3) onto those names, runs
one chunk `tokens [S]` and returns its logits `[S, V]`, the new state (the new slots are the last
rows of the raw streams) and the chunk's raw post-RoPE streams, one array per stream with the
layers stacked on dim 0. It never changes its inputs.
"""

from __future__ import annotations

import numpy as np

from psa_edge.contract import GraphIO, State, slots_from


class Graph:
    backend = ""

    def __init__(self, io: GraphIO, manifest: dict, identity: str):
        self.io, self.manifest, self.identity = io, manifest, identity

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State, State]:
        io = self.io
        feeds = {"input_ids": tokens.reshape(1, -1)}
        past_len = state[io.cache_io[0][0]].shape[2]
        feeds.update(io.spec.feeds(io, tokens.size, past_len))
        feeds.update((name_in, state[key]) for key, name_in in io.state_io)
        out = self.run(feeds)
        new_state = {key: out[name_out] for key, _, name_out in io.cache_io}
        raw = {stream: out[name_out] for stream, name_out in io.raw_io}
        new_state.update(slots_from(raw, io))
        return out["logits"][0], new_state, raw
