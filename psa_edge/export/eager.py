"""The eager backend: the PyTorch float reference behind the runtime's `Graph` interface.

Contract: `EagerGraph(checkpoint)` (or `EagerGraph.from_model(model)`) steps the fp32
`PSATransformer.forward_with_state` on numpy state, with the state names, shapes and raw
outputs of an exported explicit-state graph, so a `Session` runs on it unchanged. It is the
reference that `psa-edge verify` compares every backend against. Imports torch, so it lives
here and not in `runtime/`; `runtime.graph.open_graph` imports it only when a checkpoint (not
an artifact) is opened.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from psa_edge.export.graphs import input_names, output_names, raw_fields, state_fields
from psa_edge.model.checkpoint import load_checkpoint
from psa_edge.model.transformer import PSATransformer
from psa_edge.runtime.graph import Graph, State


def manifest_for(model: PSATransformer, identity: str, max_seq_len: int | None = None) -> dict:
    cfg = model.cfg
    return {"kind": "checkpoint", "backend": "eager", "target": "eager",
            "form": "explicit-state", "config": cfg.to_dict(), "artifact_sha256": identity,
            "max_seq_len": max_seq_len or cfg.max_position_embeddings,
            "io": {"inputs": input_names(cfg), "outputs": output_names(cfg),
                   "state_fields": state_fields(cfg), "raw_fields": raw_fields(cfg)}}


class EagerGraph(Graph):
    backend = "eager"

    def __init__(self, checkpoint: Path, manifest: dict | None = None,
                 model: PSATransformer | None = None):
        if model is None:
            model, _ = load_checkpoint(checkpoint)
        identity = (manifest or {}).get("artifact_sha256", f"eager:{checkpoint}")
        super().__init__(Path(checkpoint), manifest_for(model, identity))
        self.model = model.float().eval()

    @classmethod
    def from_model(cls, model: PSATransformer, name: str = "model",
                   max_seq_len: int | None = None) -> "EagerGraph":
        graph = cls(Path(name), model=model)
        graph.manifest["max_seq_len"] = max_seq_len or model.cfg.max_position_embeddings
        graph.spec = type(graph.spec).from_manifest(graph.manifest)
        return graph

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State, State]:
        spec = self.spec
        layers = [{f: torch.from_numpy(np.ascontiguousarray(state[f"{i}.{f}"]))
                   for f in spec.state_fields} for i in range(spec.num_layers)]
        with torch.no_grad():
            logits, new_state, raws = self.model.forward_with_state(
                torch.from_numpy(tokens.reshape(1, -1)), layers)
        out = {f"{i}.{f}": new_state[i][f].numpy() for i in range(spec.num_layers)
               for f in spec.state_fields}
        raw = {f: torch.cat([layer[f.removeprefix("raw_")] for layer in raws]).numpy()
               for f in spec.raw_fields}
        return logits[0].numpy(), out, raw
