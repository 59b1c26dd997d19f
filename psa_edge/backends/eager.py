"""The eager backend: the PyTorch float reference behind `base.Graph`'s interface.

Contract: `EagerGraph(model, name, max_seq_len)` steps the fp32
`PSATransformer.forward_with_state` on numpy state, with the state names, shapes and raw
outputs of an exported explicit-state graph (`contract.GraphIO`), so a `Session` runs on it
unchanged. It is the reference the checks compare every backend against.
"""

from __future__ import annotations

import numpy as np
import torch

from psa_edge.backends.base import Graph
from psa_edge.contract import GraphIO, State
from psa_edge.model.transformer import PSATransformer


class EagerGraph(Graph):
    backend = "eager"

    def __init__(self, model: PSATransformer, name: str, max_seq_len: int | None = None):
        cfg = model.cfg.to_dict()
        max_len = max_seq_len or model.cfg.max_position_embeddings
        io = GraphIO.from_config(cfg, max_len)
        manifest = {"kind": "checkpoint", "target": "eager", "form": io.form, "config": cfg,
                    "max_seq_len": max_len, "io": io.manifest_block()}
        super().__init__(io, manifest, f"eager:{name}")
        self.model = model.float().eval()

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State, State]:
        io = self.io
        layers = [{f: torch.from_numpy(np.ascontiguousarray(state[f"{i}.{f}"]))
                   for f in io.state_fields} for i in range(io.num_layers)]
        with torch.no_grad():
            logits, new_state, raws = self.model.forward_with_state(
                torch.from_numpy(tokens.reshape(1, -1)), layers)
        out = {f"{i}.{f}": new_state[i][f].numpy() for i in range(io.num_layers)
               for f in io.state_fields}
        raw = {f: torch.cat([layer[f.removeprefix("raw_")] for layer in raws]).numpy()
               for f in io.raw_fields}
        return logits[0].numpy(), out, raw
