"""Small pure tensor functions of the PSA transformer: RMSNorm, RoPE and the shear.

Contract (docs/reference/spec.md §1-§2):
- `rope_cos_sin(positions, rope_inv_freq(head_dim, theta))` gives the Hugging Face Llama tables
  for integer positions; `apply_rope` uses the rotate-half convention.
- `shear(x, prev, gamma)` is the upper shear along the sequence axis (dim -2):
  `x^_t = x_t + gamma (x_t - x_{t-1})`, where `x_{-1}` of this chunk is `prev` (`[..., 1, d]`,
  zeros at the start of a sequence). It is written as Sub, Mul, Add so that every exporter lowers
  it to exactly those elementwise ops. It must be applied to post-RoPE streams.
- `shear_scores(scores, gamma)` is the key shear moved onto attention scores over raw keys from
  a sequence's start (the raw-key form's cache): linear in the key, so the scores of the
  sheared keys, along the key axis (dim -1).
"""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def rope_cos_sin(positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin of shape `[S, head_dim]` for integer positions `[S]`."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate `x` `[B, H, S, d]` by the position tables `[S, d]`."""
    return x * cos + rotate_half(x) * sin


def causal_bias(positions: Tensor, key_len: int, group: int = 1) -> Tensor:
    """Additive mask `[group * S, key_len]`: 0 where key position <= query position, else -inf;
    with `group` > 1, the rows of a GQA group's stacked queries (`Attention.attend`).

    Built once per call and added to every layer's scores, so the per-layer attention
    arithmetic is a plain Add that backends delegate (a boolean masked_fill is not)."""
    if group > 1:
        positions = positions.repeat(group)
    visible = torch.arange(key_len, device=positions.device)[None, :] <= positions[:, None]
    return torch.zeros(visible.shape, device=positions.device).masked_fill(~visible,
                                                                          float("-inf"))


def previous(x: Tensor, prev: Tensor) -> Tensor:
    """The stream shifted one step back along dim -2, with `prev` in front: `x_{t-1}`."""
    if is_one_step(x):  # a single new position: its predecessor is the slot itself
        return prev
    # Concatenate first, then drop the last row: slicing x to length S-1 first would make
    # torch.export guard on S-1 != 1 and refuse a dynamic chunk length.
    return torch.cat([prev, x], dim=-2)[..., :-1, :]


def last(x: Tensor) -> Tensor:
    """The last position along dim -2, `[..., 1, d]`: the next previous-key slot."""
    return x if is_one_step(x) else x[..., -1:, :]


def is_one_step(x: Tensor) -> bool:
    """Whether x holds exactly one position, known at trace time. In eager mode and in a graph
    exported with S = 1 (ExecuTorch's `decode` method) the length is a Python int, and the shift
    and slot need no op; with a dynamic length (a SymInt) the general path is traced."""
    return isinstance(x.shape[-2], int) and x.shape[-2] == 1


def shear(x: Tensor, prev: Tensor, gamma: float) -> Tensor:
    """Upper shear `x + gamma * (x - x_prev)`; `prev` is the element before this chunk."""
    momentum = x - previous(x, prev)
    return momentum * gamma + x


def shear_scores(scores: Tensor, gamma: float) -> Tensor:
    """The key shear applied to attention scores `[..., rows, T]` over raw keys from a
    sequence's start: along the key axis (dim -1), with a zero score before the first key
    (the causal zero state). Equal to the scores of the sheared keys, since the shear is linear
    in the key. Concatenate first, then drop the last column, as `previous` does."""
    shifted = torch.cat([torch.zeros_like(scores[..., :1]), scores], dim=-1)[..., :-1]
    return (scores - shifted) * gamma + scores
