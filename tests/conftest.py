"""Shared fixtures: tiny models of each variant, built once per session."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from psa_edge.model import PSATransformer, preset_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def make_model(variant="key-only", gamma=None, seed=0, **overrides):
    import torch

    torch.manual_seed(seed)
    cfg = preset_config("tiny", variant, gamma, **overrides)
    model = PSATransformer(cfg).eval()
    # Larger-than-init weights so that attention is far from uniform and errors show.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def gqa_models():
    """One model per variant with grouped-query attention (4 query heads, 2 KV heads)."""
    return {v: make_model(v, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
            for v in ("baseline", "key-only", "symmetric", "query-only")}
