"""An independent numpy implementation of the PSA Llama forward, for tests only.

Written from the formulas of docs/reference/spec.md §1 with explicit loops (no code shared with
psa_edge.model): RoPE as rotation of the (i, i + d/2) pairs, the shear as a loop over positions
with a zero initial state, causal softmax attention, RMSNorm and SwiGLU. `placement="pre"`
applies the shear before RoPE, the bug the placement corollary forbids.
"""

import numpy as np


def rope(x, theta):
    """x [S, d] -> rotated, position t rotates pair (i, i + d/2) by t * theta^(-2i/d)."""
    s, d = x.shape
    out = np.empty_like(x)
    for t in range(s):
        for i in range(d // 2):
            angle = t * theta ** (-2.0 * i / d)
            a, b = x[t, i], x[t, i + d // 2]
            out[t, i] = a * np.cos(angle) - b * np.sin(angle)
            out[t, i + d // 2] = a * np.sin(angle) + b * np.cos(angle)
    return out


def shear_loop(x, gamma):
    out = np.empty_like(x)
    prev = np.zeros(x.shape[1])
    for t in range(x.shape[0]):
        out[t] = x[t] + gamma * (x[t] - prev)
        prev = x[t]
    return out


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def attention_scores(q_raw, k_raw, cfg, placement="post"):
    """Scores [S, S] (pre-mask) of one query head and its KV head from raw projections [S, d]."""
    if placement == "post":
        q = shear_loop(rope(q_raw, cfg.rope_theta), cfg.gamma_q)
        k = shear_loop(rope(k_raw, cfg.rope_theta), cfg.gamma_k)
    else:
        q = rope(shear_loop(q_raw, cfg.gamma_q), cfg.rope_theta)
        k = rope(shear_loop(k_raw, cfg.gamma_k), cfg.rope_theta)
    return q @ k.T / np.sqrt(q.shape[1])


def forward(sd, cfg, tokens, placement="post"):
    """Logits [S, V] of one sequence; sd maps LlamaForCausalLM names to float64 arrays."""
    h, hkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = sd["model.embed_tokens.weight"][tokens]
    s = len(tokens)
    causal = np.tril(np.ones((s, s), dtype=bool))
    for li in range(cfg.num_hidden_layers):
        p = f"model.layers.{li}."
        xn = rms(x, sd[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = xn @ sd[p + "self_attn.q_proj.weight"].T
        k = xn @ sd[p + "self_attn.k_proj.weight"].T
        v = xn @ sd[p + "self_attn.v_proj.weight"].T
        heads = []
        for head in range(h):
            kv = head // (h // hkv)
            scores = attention_scores(q[:, head * dh:(head + 1) * dh],
                                      k[:, kv * dh:(kv + 1) * dh], cfg, placement)
            scores = np.where(causal, scores, -np.inf)
            w = np.exp(scores - scores.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            heads.append(w @ v[:, kv * dh:(kv + 1) * dh])
        x = x + np.concatenate(heads, axis=1) @ sd[p + "self_attn.o_proj.weight"].T
        xn = rms(x, sd[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = xn @ sd[p + "mlp.gate_proj.weight"].T
        up = xn @ sd[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ sd[p + "mlp.down_proj.weight"].T
    x = rms(x, sd["model.norm.weight"], cfg.rms_norm_eps)
    return x @ sd["lm_head.weight"].T
