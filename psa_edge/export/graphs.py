"""The exportable graph forms of a PSA transformer, and their I/O names (SPEC §2-3).

Two forms, both thin wrappers over `PSATransformer.forward_with_state`, so every exporter lowers
the same arithmetic (the shear is `ops.shear`: Sub, Mul, Add after the RoPE ops):

- `ExplicitStateGraph`: `(input_ids [1, S], *past) -> (logits [1, S, V], *present, *raw)`. The
  start position is the past length P (dim 2 of the past key), as in Hugging Face optimum
  decoders without `position_ids`. ExecuTorch programs carry it twice, sharing the weights:
  method `forward` (S dynamic) and method `decode` (S = 1, where the shear's shift needs no op,
  in fp32 and in int8). Names follow optimum / onnxruntime-genai:
      past_key_values.{i}.key / .value / .prev_key / .prev_query  (inputs, in that order)
      present.{i}.key / .value                                     (outputs)
      present.raw_key / present.raw_query                          (outputs, after present)
  `prev_key` and `raw_key` exist iff gamma_k != 0, `prev_query` and `raw_query` iff
  gamma_q != 0, so the gamma = 0 twin has exactly a Llama decoder's I/O and the same cache
  tensors. `raw_key` `[layers, Hkv, S, dh]` holds the raw post-RoPE keys of the chunk, the
  layers stacked on dim 0; `raw_key[i:i+1, :, -1:]` is layer i's next previous-key slot. There
  is no slot output, and one raw output rather than one per layer: each graph output costs ONNX
  Runtime a few microseconds per call, as much as the shear's arithmetic
  (docs/decode-profile.md).
- `RunnerGraph`: `forward(tokens [1, S], input_pos [1]) -> logits [1, S, V]` with a static
  max-length cache and the previous-key/query slots as mutable buffers, the form ExecuTorch's
  LLM runner drives.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from psa_edge.model.config import ModelConfig
from psa_edge.model.ops import causal_bias, rope_cos_sin
from psa_edge.model.transformer import PSATransformer
from psa_edge.runtime.graph import CACHE_FIELDS, RAW_OF_SLOT


def state_fields(cfg: ModelConfig) -> list[str]:
    """The per-layer state tensors this config carries, in I/O order."""
    fields = list(CACHE_FIELDS)
    if cfg.gamma_k != 0:
        fields.append("prev_key")
    if cfg.gamma_q != 0:
        fields.append("prev_query")
    return fields


def raw_fields(cfg: ModelConfig) -> list[str]:
    """The raw streams a graph returns, one output each with the layers stacked: one per
    sheared stream, whose last row is that stream's next slot."""
    return [raw for slot, raw in RAW_OF_SLOT.items() if slot in state_fields(cfg)]


def input_names(cfg: ModelConfig) -> list[str]:
    return ["input_ids"] + [f"past_key_values.{i}.{f}" for i in range(cfg.num_hidden_layers)
                            for f in state_fields(cfg)]


def output_names(cfg: ModelConfig) -> list[str]:
    layers = range(cfg.num_hidden_layers)
    return (["logits"] + [f"present.{i}.{f}" for i in layers for f in CACHE_FIELDS]
            + [f"present.{f}" for f in raw_fields(cfg)])


def state_shape(cfg: ModelConfig, field: str, past_len: int) -> tuple[int, int, int, int]:
    heads = cfg.num_attention_heads if field == "prev_query" else cfg.num_key_value_heads
    length = past_len if field in CACHE_FIELDS else 1
    return (1, heads, length, cfg.head_dim)


class ExplicitStateGraph(nn.Module):
    def __init__(self, model: PSATransformer):
        super().__init__()
        self.model = model
        self.fields = state_fields(model.cfg)
        self.raw = raw_fields(model.cfg)

    def layer_states(self, past: tuple[Tensor, ...]) -> list[dict[str, Tensor]]:
        """The flat past inputs as one state dict per layer."""
        n = len(self.fields)
        return [dict(zip(self.fields, past[i:i + n])) for i in range(0, len(past), n)]

    def forward(self, input_ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        logits, new_state, raws = self.model.forward_with_state(input_ids,
                                                                self.layer_states(past))
        present = [layer[f] for layer in new_state for f in CACHE_FIELDS]
        raw = [torch.cat([layer[f.removeprefix("raw_")] for layer in raws]) for f in self.raw]
        return (logits, *present, *raw)

    def graph_outputs(self) -> list[str]:
        """The names of what `forward` returns, in order."""
        return output_names(self.model.cfg)


def example_inputs(cfg: ModelConfig, seq_len: int, past_len: int) -> tuple[Tensor, ...]:
    ids = torch.zeros(1, seq_len, dtype=torch.long)
    state = [torch.zeros(state_shape(cfg, f, past_len)) for _ in range(cfg.num_hidden_layers)
             for f in state_fields(cfg)]
    return (ids, *state)


def dynamic_shapes(cfg: ModelConfig, max_seq_len: int, decode: bool = False):
    """torch.export dims: chunk length S in [1, max] (fixed at 1 for the decode method), past
    length P in [0, max - 1]."""
    from torch.export import Dim

    seq = None if decode else {1: Dim("seq_len", min=1, max=max_seq_len)}
    past = Dim("past_len", min=0, max=max_seq_len - 1)
    state = tuple({2: past} if f in CACHE_FIELDS else None
                  for _ in range(cfg.num_hidden_layers) for f in state_fields(cfg))
    return (seq, state)  # the structure of forward(input_ids, *past)


class RunnerGraph(nn.Module):
    """Static-cache form: KV cache `[1, Hkv, max_seq_len, dh]` and slots as mutable buffers."""

    def __init__(self, model: PSATransformer, max_seq_len: int):
        super().__init__()
        cfg = model.cfg
        self.model, self.max_seq_len = model, max_seq_len
        for i in range(cfg.num_hidden_layers):
            for f in state_fields(cfg):
                shape = state_shape(cfg, f, max_seq_len)
                self.register_buffer(f"cache_{i}_{f}", torch.zeros(shape), persistent=False)

    def forward(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        m = self.model
        positions = torch.arange(tokens.shape[1]) + input_pos
        cos, sin = rope_cos_sin(positions, m.inv_freq)
        bias = causal_bias(positions, self.max_seq_len)
        # At position 0 the slots still hold the previous sequence's last keys; the boundary
        # state is zero (SPEC §1), so they are masked to zero there.
        fresh = (input_pos > 0).to(torch.float32)
        x = m.model.embed_tokens(tokens)
        for i, layer in enumerate(m.model.layers):
            attn = layer.self_attn
            query, key, value = attn.project(layer.input_layernorm(x), cos, sin)
            slots = {f: getattr(self, f"cache_{i}_{f}") for f in ("prev_key", "prev_query")
                     if hasattr(self, f"cache_{i}_{f}")}
            sheared_query, sheared_key = attn.shear_streams(
                query, key, slots.get("prev_query", 0) * fresh, slots.get("prev_key", 0) * fresh)
            for field, raw in (("prev_key", key), ("prev_query", query)):
                if field in slots:
                    slots[field].copy_(raw[:, :, -1:, :])
            key_cache, value_cache = (getattr(self, f"cache_{i}_key"),
                                      getattr(self, f"cache_{i}_value"))
            key_cache.index_copy_(2, positions, sheared_key)
            value_cache.index_copy_(2, positions, value)
            x = x + attn.attend(sheared_query, key_cache, value_cache, bias)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return m.lm_head(m.model.norm(x))
