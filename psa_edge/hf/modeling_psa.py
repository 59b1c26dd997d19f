"""Phase Space Attention for Hugging Face transformers: the remote code of `psa-edge export-hf`.

This file is copied, as it is, into every exported folder of a model with a shear (gamma > 0) and
registered through `auto_map`, so `AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)` builds it. It needs torch and transformers only (no psa-edge).

A PSA model is a Llama model whose attention shears each post-RoPE key (and query) by its first
backward difference, `k^_j = k_j + gamma_k (k_j - k_{j-1})`, from a zero state before the first
position; the KV cache holds the sheared keys. With a cache, the raw key of the position before
a chunk is read back from the cached sheared keys: inverting the shear,
`k_{P-1} = sum_i a b^(P-1-i) k^_i` with a = 1 / (1 + gamma_k), b = gamma_k / (1 + gamma_k), a
geometric sum that reaches fp32 precision within a few dozen positions. Queries are not cached,
so a model with gamma_q > 0 runs without a cache (`use_cache` is false in its config).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as llama


class PSAConfig(LlamaConfig):
    model_type = "psa_llama"

    def __init__(self, gamma_q: float = 0.0, gamma_k: float = 0.8,
                 psa_variant: str = "key-only", **kwargs):
        self.gamma_q, self.gamma_k, self.psa_variant = gamma_q, gamma_k, psa_variant
        super().__init__(**kwargs)


def shear(x: torch.Tensor, prev: torch.Tensor, gamma: float) -> torch.Tensor:
    """`x + gamma (x - x_prev)` along the sequence (dim 2), `prev` before the first position."""
    shifted = torch.cat([prev, x], dim=2)[:, :, :-1]
    return x + gamma * (x - shifted)


def cached_keys(cache, layer: int) -> torch.Tensor | None:
    """The sheared keys a transformers cache holds for a layer (None when empty)."""
    if cache is None:
        return None
    if hasattr(cache, "layers"):  # transformers 5
        if layer >= len(cache.layers):
            return None
        keys = getattr(cache.layers[layer], "keys", None)
    else:  # transformers 4
        keys = cache.key_cache[layer] if layer < len(getattr(cache, "key_cache", [])) else None
    return keys if keys is not None and keys.numel() and keys.shape[2] else None


def previous_raw_key(sheared: torch.Tensor, gamma: float) -> torch.Tensor:
    """The raw key of the last cached position, from the cached sheared keys."""
    length = sheared.shape[2]
    a, b = 1.0 / (1.0 + gamma), gamma / (1.0 + gamma)
    powers = torch.arange(length - 1, -1, -1, device=sheared.device, dtype=torch.float64)
    weights = (a * b ** powers).to(sheared.dtype)
    return torch.einsum("bhsd,s->bhd", sheared, weights)[:, :, None, :]


class PSAAttention(llama.LlamaAttention):
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, *args,
                **kwargs):
        cache = (kwargs.pop("cache", None) or kwargs.pop("past_key_values", None)
                 or kwargs.pop("past_key_value", None) or (args[0] if args else None))
        config = self.config
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = position_embeddings
        query, key = llama.apply_rotary_pos_emb(query, key, cos, sin)
        past = cached_keys(cache, self.layer_idx)
        if config.gamma_k:
            prev = (torch.zeros_like(key[:, :, :1]) if past is None
                    else previous_raw_key(past, config.gamma_k))
            key = shear(key, prev, config.gamma_k)
        if config.gamma_q:
            if past is not None:
                raise ValueError("a PSA model with gamma_q > 0 cannot continue from a KV cache "
                                 "(queries are not cached); call it with use_cache=False")
            query = shear(query, torch.zeros_like(query[:, :, :1]), config.gamma_q)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        implementation = config._attn_implementation
        attend = (llama.eager_attention_forward if implementation in (None, "eager")
                  else llama.ALL_ATTENTION_FUNCTIONS[implementation])
        out, weights = attend(self, query, key, value, attention_mask, dropout=0.0,
                              scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


class PSAForCausalLM(llama.LlamaForCausalLM):
    config_class = PSAConfig

    def __init__(self, config: PSAConfig):
        super().__init__(config)
        for index, layer in enumerate(self.model.layers):
            attention = PSAAttention(config, index)
            attention.load_state_dict(layer.self_attn.state_dict())
            layer.self_attn = attention
        self.post_init()
