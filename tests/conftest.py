"""Shared fixtures: tiny models of each variant and their exported artifacts, built once per
session (the export and runtime tests share the artifacts)."""

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


MAX_LEN = 48
CASES = {  # name -> (variant, target, twin, form)
    "onnx": ("symmetric", "onnx", False, "explicit-state"),
    "onnx-twin": ("symmetric", "onnx", True, "explicit-state"),
    "xnnpack": ("symmetric", "xnnpack", False, "explicit-state"),
    "xnnpack-twin": ("symmetric", "xnnpack", True, "explicit-state"),
    "portable": ("key-only", "portable", False, "explicit-state"),
    "runner": ("key-only", "xnnpack", False, "runner"),
    "runner-twin": ("key-only", "xnnpack", True, "runner"),
}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    from psa_edge.model.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for variant in ("symmetric", "key-only"):
        # GQA (4 query heads over 2 KV heads) and 2 layers, so the I/O carries both.
        model = make_model(variant, num_attention_heads=4, num_key_value_heads=2,
                           num_hidden_layers=2)
        out[variant] = root / f"{variant}.pt"
        save_checkpoint(out[variant], model, {"task": {"name": "ih-sht", "params": {
            "seq_len": 64, "alphabet": 64}}})
    return out


@pytest.fixture(scope="session")
def artifacts(checkpoints, tmp_path_factory):
    from psa_edge.export.pipeline import ExportRequest, run_export

    root = tmp_path_factory.mktemp("artifacts")
    out = {}
    for name, (variant, target, twin, form) in CASES.items():
        suffix = ".onnx" if target == "onnx" else ".pte"
        path = root / f"{name}{suffix}"
        run_export(ExportRequest(checkpoints[variant], target, path, MAX_LEN, twin, form))
        out[name] = path
    return out


