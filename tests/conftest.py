"""Shared helpers: tiny models of each variant, the artifact cases, the CLI in a subprocess.
The session's exports are fixtures of the `exported` plugin (tests/exported.py)."""

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from psa_edge.model import PSATransformer, preset_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# The first-open checks (runtime.guard) remember what they checked: here, not in the user's home.
os.environ["PSA_EDGE_CACHE"] = tempfile.mkdtemp(prefix="psa-edge-test-cache-")
pytest_plugins = ["exported"]


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
    "fused": ("symmetric", "onnx", False, "fused"),
    "fused-twin": ("symmetric", "onnx", True, "fused"),
    "raw-key": ("key-only", "onnx", False, "raw-key"),
}


def manifest_of(artifact):
    """The manifest of an artifact folder."""
    import json

    return json.loads((Path(artifact) / "manifest.json").read_text())


def model_file(artifact):
    """The model file inside an artifact folder."""
    return next(Path(artifact) / n for n in ("model.onnx", "model.pte")
                if (Path(artifact) / n).exists())


def copy_artifact(artifact, dest):
    import shutil

    shutil.copytree(artifact, dest)
    return Path(dest)


def cli(*args, cwd=None, timeout=300):
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "psa_edge.cli", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)


def assert_umask_modes(*paths):
    """Files and folders the tools write have the permissions the user's umask gives."""
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    for path in paths:
        path = Path(path)
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == expected, (path, oct(path.stat().st_mode))
