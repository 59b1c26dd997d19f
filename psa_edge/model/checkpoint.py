"""The `model.pt` checkpoint format (docs/spec.md §8).

A checkpoint is a dict of plain data: `format` (FORMAT_TAG), `version`, `config` (ModelConfig
dict), `state_dict` (str -> tensor, LlamaForCausalLM names) and `metadata` (task, training
arguments and results). It is read with `torch.load(weights_only=True)` only, so a pickle that
carries code is refused, never run. Writing is atomic and leaves `model.pt.json` beside it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from psa_edge.errors import CheckpointError, ConfigError
from psa_edge.io import atomic_output, manifest_path, sha256_file, versions, write_json
from psa_edge.model.config import ModelConfig
from psa_edge.model.transformer import PSATransformer

FORMAT_TAG = "psa-edge-checkpoint"
FORMAT_VERSION = 1


def save_checkpoint(path: str | os.PathLike, model: PSATransformer, metadata: dict) -> dict:
    payload = {
        "format": FORMAT_TAG,
        "version": FORMAT_VERSION,
        "config": model.cfg.to_dict(),
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "metadata": metadata,
    }
    with atomic_output(path) as tmp:
        torch.save(payload, tmp)
    manifest = {"kind": "checkpoint", "artifact": Path(path).name,
                "artifact_sha256": sha256_file(path), "config": model.cfg.to_dict(),
                "gamma_q": model.cfg.gamma_q, "gamma_k": model.cfg.gamma_k,
                "variant": model.cfg.variant, "versions": versions(), "metadata": metadata}
    write_json(manifest_path(path), manifest)
    return manifest


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The validated payload dict of a checkpoint file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with warnings.catch_warnings():  # torch warns about old pickle protocols on stderr
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unusable file
        text = " ".join(str(exc).split())
        reason = text.split(". ")[0] if text else type(exc).__name__
        if "unsupported GLOBAL" in text:  # a pickle that names code: say which, never run it
            reason = "refused to unpickle " + text.split("unsupported GLOBAL")[1].split()[0]
        raise CheckpointError(f"{path} is not a readable psa-edge checkpoint ({reason[:160]})")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT_TAG:
        tag = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path} has format tag {tag!r}, expected {FORMAT_TAG!r}")
    if payload.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint version {payload.get('version')!r}, "
                              f"this psa-edge reads version {FORMAT_VERSION}")
    for key in ("config", "state_dict", "metadata"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path} has no {key} dict")
    return payload


def load_checkpoint(path: str | os.PathLike) -> tuple[PSATransformer, dict]:
    """The model (eval mode, fp32) and metadata of a checkpoint."""
    payload = read_checkpoint(path)
    try:
        cfg = ModelConfig.from_dict(payload["config"])
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{path} has an invalid config: {exc}")
    model = PSATransformer(cfg)
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise CheckpointError(f"{path} weights do not match its config: {first[:160]}")
    return model.eval(), payload["metadata"]

