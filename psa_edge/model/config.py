"""Model configuration: `LlamaConfig` fields plus the PSA shear, and the named presets.

Contract (docs/reference/spec.md §1): every field except `gamma_q`, `gamma_k` and `variant` has the
name and meaning of the Hugging Face `LlamaConfig` field of the same name, so `to_llama_dict()` is a
valid `LlamaConfig(**d)` argument set. The variant names a shear layout and constrains the gammas:

    baseline    gamma_q == 0 and gamma_k == 0     (plain Llama attention)
    key-only    gamma_q == 0 and gamma_k  > 0     (the accuracy-optimal "half-lift", default)
    symmetric   gamma_q == gamma_k > 0
    query-only  gamma_q  > 0 and gamma_k == 0     (negative control)

A config that breaks these rules cannot be constructed (`ConfigError`). This module does not
import torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from psa_edge.contract import check_config
from psa_edge.errors import ConfigError

VARIANTS = ("baseline", "key-only", "symmetric", "query-only")
DEFAULT_VARIANT = "key-only"
DEFAULT_GAMMA = 0.8
# Storage precisions of a checkpoint's weights: float16 halves a shipped file
# (models/psa-code.pt) at a relative rounding of at most 2^-11 per weight; its effect on
# perplexity: docs/results/code-model.md.
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 64
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 1
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    gamma_q: float = 0.0
    gamma_k: float = DEFAULT_GAMMA
    variant: str = DEFAULT_VARIANT

    def __post_init__(self) -> None:
        if not isinstance(self.variant, str):
            raise ConfigError(f"config field variant must be a name, got {self.variant!r}")
        check_config(dataclasses.asdict(self))  # types, ranges and size, before any allocation
        if not isinstance(self.tie_word_embeddings, bool):
            raise ConfigError(f"config field tie_word_embeddings must be true or false, got "
                              f"{self.tie_word_embeddings!r}")
        check_variant(self.variant, self.gamma_q, self.gamma_k)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def query_group(self) -> int:
        """Query heads per KV head (GQA; 1 without)."""
        return self.num_attention_heads // self.num_key_value_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_llama_dict(self) -> dict:
        """The `LlamaConfig` keyword arguments this config denotes (gammas dropped)."""
        d = self.to_dict()
        for psa_field in ("gamma_q", "gamma_k", "variant"):
            d.pop(psa_field)
        d.update(head_dim=self.head_dim, hidden_act="silu", attention_bias=False, mlp_bias=False)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config fields: {', '.join(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def twin(self) -> "ModelConfig":
        """The gamma = 0 twin: same architecture, plain attention (docs/reference/spec.md §1)."""
        return self.replace(gamma_q=0.0, gamma_k=0.0, variant="baseline")


def check_variant(variant: str, gamma_q: float, gamma_k: float) -> None:
    if variant not in VARIANTS:
        raise ConfigError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    ok = {
        "baseline": gamma_q == 0 and gamma_k == 0,
        "key-only": gamma_q == 0 and gamma_k > 0,
        "symmetric": gamma_q == gamma_k and gamma_k > 0,
        "query-only": gamma_q > 0 and gamma_k == 0,
    }[variant]
    if not ok:
        raise ConfigError(
            f"gamma_q={gamma_q:g}, gamma_k={gamma_k:g} contradicts variant {variant!r}"
        )


def gammas_for(variant: str, gamma: float | None) -> tuple[float, float]:
    """(gamma_q, gamma_k) for a variant and the single `--gamma` a user gives.

    `gamma=None` means the default: 0.8 for a sheared variant, 0 for baseline. A gamma that the
    variant cannot carry (non-zero for baseline, <= 0 for a sheared variant) is refused.
    """
    if variant not in VARIANTS:
        raise ConfigError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if variant == "baseline":
        if gamma not in (None, 0, 0.0):
            raise ConfigError(f"--gamma {gamma:g} contradicts variant 'baseline' (gamma is 0)")
        return 0.0, 0.0
    g = DEFAULT_GAMMA if gamma is None else float(gamma)
    if g <= 0:
        raise ConfigError(f"--gamma {g:g} contradicts variant {variant!r} (needs gamma > 0)")
    return {"key-only": (0.0, g), "symmetric": (g, g), "query-only": (g, 0.0)}[variant]


# Architecture presets. vocab_size is the preset's own (used for its parameter count); a task
# overrides it with the task's vocabulary when a model is trained on that task.
PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512),
    # The single-layer induction preset of the README's tables: wide enough (256) for ih-sht.
    "psa-0.5m": dict(vocab_size=64, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512),
    # A small language model for text experiments a CPU trains in minutes.
    "psa-1m": dict(vocab_size=2048, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512),
    "psa-4m": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024),
    "psa-30m": dict(vocab_size=8192, hidden_size=512, intermediate_size=1280,
                    num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                    max_position_embeddings=2048),
    "psa-92m": dict(vocab_size=8192, hidden_size=768, intermediate_size=2176,
                    num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                    max_position_embeddings=2048),
}


def preset_config(name: str, variant: str = DEFAULT_VARIANT, gamma: float | None = None,
                  **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    gamma_q, gamma_k = gammas_for(variant, gamma)
    fields = {**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}}
    return ModelConfig(**fields, gamma_q=gamma_q, gamma_k=gamma_k, variant=variant)
