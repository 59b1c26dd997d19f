"""The PSA transformer: a Llama decoder with the PSA shear after RoPE.

Contract (docs/reference/spec.md §1, §3):
- Parameter names are those of Hugging Face `LlamaForCausalLM` (`model.embed_tokens.weight`,
  `model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`); no
  parameter depends on gamma, so a gamma = 0 model is a plain Llama model.
- `forward(input_ids)` is the full-sequence forward from the zero initial state.
- `forward_with_state(input_ids, state)` is the incremental forward over explicit state. A state
  is a list with one dict per layer:
      "key"        sheared keys k^  [B, Hkv, P, dh]
      "value"      values           [B, Hkv, P, dh]
      "prev_key"   raw post-RoPE key at P-1 [B, Hkv, 1, dh]  (only when gamma_k != 0)
      "prev_query" raw post-RoPE query at P-1 [B, H, 1, dh]  (only when gamma_q != 0)
  The position of the first new token is P, the state's length. It returns the logits of the new
  tokens, the new state and, per layer, the raw post-RoPE keys (and queries when gamma_q != 0) of
  the new positions, which are what a runtime needs to roll the slots back to any position.
  Any chunking of a sequence gives the logits of the full-sequence forward.
- `decode(input_ids, positions, caches, key_len)` is the one layer loop every form runs: each
  layer reads its slots from, writes its keys and values to, and attends through a
  `LayerCache` (explicit here, with `attend`; the runner form's static cache, with ExecuTorch's
  attention kernel, in psa_edge/export/forms.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from psa_edge.model.config import ModelConfig
from psa_edge.model.ops import (apply_rope, causal_bias, last, rms_norm, rope_cos_sin,
                                rope_inv_freq, shear, shear_scores)

LayerState = dict[str, Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, hkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * dh, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, hkv * dh, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, hkv * dh, bias=False)
        self.o_proj = nn.Linear(h * dh, cfg.hidden_size, bias=False)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        b, s, _ = x.shape
        return x.view(b, s, n, self.cfg.head_dim).transpose(1, 2)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Raw post-RoPE query `[B, H, S, dh]`, key and value `[B, Hkv, S, dh]`."""
        cfg = self.cfg
        query = apply_rope(self._heads(self.q_proj(x), cfg.num_attention_heads), cos, sin)
        key = apply_rope(self._heads(self.k_proj(x), cfg.num_key_value_heads), cos, sin)
        return query, key, self._heads(self.v_proj(x), cfg.num_key_value_heads)

    def shear_streams(self, query: Tensor, key: Tensor, prev_query: Tensor | None,
                      prev_key: Tensor | None) -> tuple[Tensor, Tensor]:
        """The sheared query and key (docs/reference/spec.md §1); a stream with gamma = 0 passes
        unchanged, and so does a key with no slot (`prev_key` None: a cache of raw keys that
        shears them itself, the raw-key form's)."""
        cfg = self.cfg
        if cfg.gamma_k != 0 and prev_key is not None:
            key = shear(key, prev_key, cfg.gamma_k)
        if cfg.gamma_q != 0:
            query = shear(query, prev_query, cfg.gamma_q)
        return query, key

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor, cache: "LayerCache"
                ) -> Tensor:
        query, key, value = self.project(x, cos, sin)
        sheared_query, sheared_key = self.shear_streams(query, key, cache.prev_query,
                                                        cache.prev_key)
        keys, values = cache.update(sheared_key, value, key, query)
        return self.o_proj(cache.attend(sheared_query, keys, values, bias))


def attend(query: Tensor, keys: Tensor, values: Tensor, bias: Tensor, group: int,
           key_shear: float = 0.0) -> Tensor:
    """Causal softmax attention of sheared queries `[B, H, S, dh]` over cached sheared keys and
    values `[B, Hkv, T, dh]`; the heads merged, `[B, S, H dh]`.

    `key_shear` gamma != 0: the keys are raw, all T of them from the sequence's start, and the
    shear is applied to the scores along the key axis instead, q.k^_j = q.k_j + gamma (q.k_j -
    q.k_{j-1}) (the shear is linear in the key): `[B, Hkv, group S, T]` elementwise ops where
    shearing the keys takes `[B, Hkv, T, dh]`, dh times more (the raw-key form's cache).

    GQA as llama.cpp computes it: the `group` query heads that share a KV head are stacked
    along the sequence, `[B, Hkv, group * S, dh]`, and read that head's cache as it is; `bias`
    is the mask of the stacked rows (`causal_bias(..., group)`). Gathering the cache per query
    head instead (Llama's repeat_kv) copies every layer's whole key and value cache on every
    step, outside XNNPACK's delegate."""
    b, _, s, dh = query.shape
    if group > 1:
        query = query.reshape(b, -1, group * s, dh)
    scores = query @ keys.transpose(-1, -2)  # [B, Hkv, group S, T]
    if key_shear != 0:
        scores = shear_scores(scores, key_shear)
    scores = scores / math.sqrt(dh) + bias
    out = torch.softmax(scores, dim=-1) @ values
    if group > 1:
        # Not reshape(b, heads, s, dh): torch.export cannot prove that reshape's contiguity
        # guard for every dynamic chunk length.
        out = out.unflatten(2, (group, s)).flatten(1, 2)
    return out.transpose(1, 2).reshape(b, s, -1)


class LayerCache:
    """Where one layer's attention state lives. The explicit-state form (and training) carries
    it in and out of the forward: the new sheared keys and values are concatenated onto the
    past, the slots are read from the past, and `state` / `raw` hold what the call produced.
    A static-cache form subclasses it (psa_edge/export/forms.py): it writes in place instead,
    and may attend with a backend's fused kernel."""

    def __init__(self, cfg: ModelConfig, past: LayerState):
        self.cfg, self.past = cfg, past
        self.state: LayerState = {}
        self.raw: LayerState = {}

    @property
    def prev_key(self) -> Tensor | None:
        return self.past.get("prev_key")

    @property
    def prev_query(self) -> Tensor | None:
        return self.past.get("prev_query")

    def update(self, sheared_key: Tensor, value: Tensor, key: Tensor, query: Tensor
               ) -> tuple[Tensor, Tensor]:
        """Store the chunk's sheared keys and values; return every key and value attended."""
        state = {"key": torch.cat([self.past["key"], sheared_key], dim=2),
                 "value": torch.cat([self.past["value"], value], dim=2)}
        self.raw = {"key": key}
        if self.cfg.gamma_k != 0:
            state["prev_key"] = last(key)
        if self.cfg.gamma_q != 0:
            state["prev_query"] = last(query)
            self.raw["query"] = query
        self.state = state
        return state["key"], state["value"]

    def attend(self, query: Tensor, keys: Tensor, values: Tensor, bias: Tensor) -> Tensor:
        """Attention of the chunk's sheared queries over what `update` returned, `[B, S, H dh]`."""
        return attend(query, keys, values, bias, self.cfg.query_group)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, bias: Tensor, cache: LayerCache
                ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, bias, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class PSATransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Not in the state_dict (as in transformers): a constant of the config.
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta),
                             persistent=False)
        self.apply(self._init_weights)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.tokenizer = None  # the model's tokenizer.Tokenizer, set by a checkpoint's loader

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # 0.02 is LlamaConfig.initializer_range's default.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def empty_state(self, batch: int = 1) -> list[LayerState]:
        cfg = self.cfg
        w = self.model.embed_tokens.weight  # a plain tensor; a torchao int4 lm_head.weight is not
        hkv, h, dh = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim
        state = []
        for _ in range(cfg.num_hidden_layers):
            layer = {"key": w.new_zeros(batch, hkv, 0, dh), "value": w.new_zeros(batch, hkv, 0, dh)}
            if cfg.gamma_k != 0:
                layer["prev_key"] = w.new_zeros(batch, hkv, 1, dh)
            if cfg.gamma_q != 0:
                layer["prev_query"] = w.new_zeros(batch, h, 1, dh)
            state.append(layer)
        return state

    def decode(self, input_ids: Tensor, positions: Tensor, caches: list[LayerCache],
               key_len: int) -> Tensor:
        """Logits of a chunk at `positions`, each layer reading and writing its cache; the
        causal mask spans `key_len` cached positions. Every form runs this loop."""
        cos, sin = rope_cos_sin(positions, self.inv_freq)
        bias = causal_bias(positions, key_len, self.cfg.query_group)
        x = self.model.embed_tokens(input_ids)
        for layer, cache in zip(self.model.layers, caches):
            x = layer(x, cos, sin, bias, cache)
        return self.lm_head(self.model.norm(x))

    def forward_with_state(self, input_ids: Tensor, state: list[LayerState]
                           ) -> tuple[Tensor, list[LayerState], list[LayerState]]:
        past_len = state[0]["key"].shape[2]
        seq_len = input_ids.shape[1]
        positions = torch.arange(seq_len, device=input_ids.device) + past_len
        caches = [LayerCache(self.cfg, past) for past in state]
        logits = self.decode(input_ids, positions, caches, past_len + seq_len)
        return logits, [c.state for c in caches], [c.raw for c in caches]

    def forward(self, input_ids: Tensor) -> Tensor:
        logits, _, _ = self.forward_with_state(input_ids, self.empty_state(input_ids.shape[0]))
        return logits


def twin_of(model: PSATransformer) -> PSATransformer:
    """The gamma = 0 twin (docs/reference/spec.md §1): the same config and weights with plain
    attention."""
    twin = PSATransformer(model.cfg.twin())
    twin.load_state_dict(model.state_dict())
    twin.tokenizer = getattr(model, "tokenizer", None)
    return twin.eval()


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
