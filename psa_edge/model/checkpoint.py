"""The `model.pt` checkpoint format (docs/reference/spec.md §8).

A checkpoint is a dict of plain data: `format` (FORMAT_TAG), `version`, `config` (ModelConfig
dict), `state_dict` (str -> tensor, LlamaForCausalLM names; float32, or float16 / bfloat16
when written with `weights_dtype`, loaded into a float32 model), `tokenizer` (the model's
tokenizer.json as text; version 2 on) and `metadata` (task, training arguments and results). It
is read with `torch.load(weights_only=True)` only, so a pickle that carries code is refused,
never run. Writing is atomic and leaves `model.pt.json`, its manifest, beside it: both (and any
sidecar files, such as the training metrics) are written under temporary names and renamed
into place only when all are complete, the checkpoint last, so a checkpoint is never there
without its manifest. A version-1 checkpoint (an
induction-task model from before tokenizers travelled) gets the character tokenizer of its
vocabulary. A loaded model carries its tokenizer as `model.tokenizer`.

A training state (`save_state` / `read_state`, `<output>.state.pt`) is the same plain data plus
the optimizer's state, the step and the metrics so far: what `psa-edge train --resume` continues
from.
"""

from __future__ import annotations

import os
import warnings
from io import BytesIO
from pathlib import Path

import torch

from psa_edge.errors import CheckpointError, ConfigError, PsaEdgeError
from psa_edge.io import (atomic_output, atomic_outputs, dumps, manifest_path, not_a_file,
                         sha256_bytes, versions)
from psa_edge.model.config import WEIGHT_DTYPES, ModelConfig
from psa_edge.model.ops import rope_inv_freq
from psa_edge.model.transformer import PSATransformer
from psa_edge.tokenizer import Tokenizer

FORMAT_TAG = "psa-edge-checkpoint"
STATE_TAG = "psa-edge-train-state"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


def tokenizer_of(model: PSATransformer) -> Tokenizer:
    return getattr(model, "tokenizer", None) or Tokenizer.chars(model.cfg.vocab_size)


def serialized(payload: dict) -> bytes:
    buffer = BytesIO()  # in memory first, so that a full disk is a Python OSError
    torch.save(payload, buffer)
    return buffer.getvalue()


def stored_weights(model: PSATransformer, dtype: str = "float32") -> dict:
    """The state dict as written: on the CPU in `dtype`, tied weights still one tensor (which
    torch.save then writes once)."""
    if dtype not in WEIGHT_DTYPES:
        raise ConfigError(f"weights dtype {dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}")
    cast: dict = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in cast:
            cast[key] = tensor.detach().cpu().to(getattr(torch, dtype))
            if not bool(torch.isfinite(cast[key]).all()):
                raise ConfigError(f"weight {name} does not fit in {dtype} (it overflows)")
    return {name: cast[(t.data_ptr(), tuple(t.shape))] for name, t in model.state_dict().items()}


def save_checkpoint(path: str | os.PathLike, model: PSATransformer, metadata: dict,
                    sidecars: dict | None = None, weights_dtype: str = "float32") -> dict:
    """Write the checkpoint, its manifest and `sidecars` ({path: bytes}) all or none; the
    weights stored in `weights_dtype` (the model computes in float32 whatever they are
    stored in)."""
    payload = {
        "format": FORMAT_TAG,
        "version": FORMAT_VERSION,
        "config": model.cfg.to_dict(),
        "state_dict": stored_weights(model, weights_dtype),
        "tokenizer": tokenizer_of(model).json,
        "chat_template": tokenizer_of(model).chat_template,
        "metadata": metadata,
    }
    data = serialized(payload)
    manifest = {"kind": "checkpoint", "artifact": Path(path).name,
                "artifact_sha256": sha256_bytes(data), "config": model.cfg.to_dict(),
                "gamma_q": model.cfg.gamma_q, "gamma_k": model.cfg.gamma_k,
                "variant": model.cfg.variant, "weights_dtype": weights_dtype,
                "versions": versions(), "metadata": metadata}
    files = {**(sidecars or {}), manifest_path(path): dumps(manifest).encode(), Path(path): data}
    with atomic_outputs(*files) as temps:
        for tmp, content in zip(temps, files.values()):
            tmp.write_bytes(content)
    return manifest


def read_checkpoint(path: str | os.PathLike, tag: str = FORMAT_TAG) -> dict:
    """The validated payload dict of a checkpoint file (or of a training state)."""
    path = Path(path)
    if (problem := not_a_file(path)) is not None:
        raise CheckpointError(f"checkpoint {path} {problem}")
    try:
        with warnings.catch_warnings():  # torch warns about old pickle protocols on stderr
            warnings.simplefilter("ignore")
            # Mapped, not read: the file's pages are the weights (model_of keeps fp32 ones).
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means an unusable file
        text = " ".join(str(exc).split())
        reason = text.split(". ")[0] if text else type(exc).__name__
        if "unsupported GLOBAL" in text:  # a pickle that names code: say which, never run it
            reason = "refused to unpickle " + text.split("unsupported GLOBAL")[1].split()[0]
        raise CheckpointError(f"{path} is not a readable psa-edge checkpoint ({reason[:160]})")
    if not isinstance(payload, dict) or payload.get("format") != tag:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"{path} has format tag {found!r}, expected {tag!r}")
    if payload.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"{path} has checkpoint version {payload.get('version')!r}, "
                              f"this psa-edge reads versions {READABLE_VERSIONS}")
    for key in ("config", "state_dict", "metadata"):
        if not isinstance(payload.get(key), dict):
            raise CheckpointError(f"{path} has no {key} dict")
    return payload


def load_checkpoint(path: str | os.PathLike) -> tuple[PSATransformer, dict]:
    """The model (eval mode, fp32, its tokenizer as `model.tokenizer`) and metadata of a
    checkpoint."""
    payload = read_checkpoint(path)
    model = model_of(payload, path)
    return model, payload["metadata"]


def model_of(payload: dict, path) -> PSATransformer:
    """The model a validated payload describes: its config checked before anything is
    allocated, every weight's name, dtype and shape against a model built on the meta device."""
    try:
        cfg = ModelConfig.from_dict(payload["config"])
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{path} has an invalid config: {exc}")
    check_weights(payload["state_dict"], cfg, path)
    check_metadata(payload["metadata"], path)
    text = payload.get("tokenizer")
    if text is not None and not isinstance(text, str):
        raise CheckpointError(f"{path} has a tokenizer that is not tokenizer.json text")
    with torch.device("meta"):  # no random init to overwrite: the weights are assigned
        model = PSATransformer(cfg)
    # The loaded tensors themselves become the parameters (fp32 ones uncast, tied ones once), so
    # the model holds its weights once: loading SmolLM2-135M (540 MB) peaked at 1.44 GB with a
    # random init and a copy, at 0.97 GB this way (measured in the export's load stage).
    model.load_state_dict(float32_weights(payload["state_dict"]), strict=True, assign=True)
    model.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta),
                          persistent=False)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    try:
        model.tokenizer = (Tokenizer(text, payload.get("chat_template")) if text
                           else Tokenizer.chars(cfg.vocab_size))
    except PsaEdgeError as exc:
        raise CheckpointError(f"{path}: {exc}")
    if model.tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{path} has a tokenizer of {model.tokenizer.vocab_size} tokens "
                              f"for a vocabulary of {cfg.vocab_size}")
    return model.eval()


def float32_weights(state: dict) -> dict:
    """The state dict in float32, a tensor shared by two names cast once."""
    cast: dict = {}
    for tensor in state.values():
        cast.setdefault((tensor.data_ptr(), tuple(tensor.shape)), tensor.float())
    return {name: cast[(t.data_ptr(), tuple(t.shape))] for name, t in state.items()}


def check_weights(state: dict, cfg: ModelConfig, path) -> None:
    with torch.device("meta"):
        expected = {k: v.shape for k, v in PSATransformer(cfg).state_dict().items()}
    names = set(state)
    if not all(isinstance(k, str) for k in names) or names != set(expected):
        missing = sorted(set(expected) - {k for k in names if isinstance(k, str)})
        extra = sorted(map(str, names - set(expected)))
        what = f"no {missing[0]}" if missing else f"an unexpected {extra[0]}"
        raise CheckpointError(f"{path} weights do not match its config: {what}")
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise CheckpointError(f"{path}: weight {name} is {kind}, not a floating-point "
                                  f"tensor")
        if tensor.shape != expected[name]:
            raise CheckpointError(f"{path} weights do not match its config: {name} has shape "
                                  f"{tuple(tensor.shape)}, the config needs "
                                  f"{tuple(expected[name])}")
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{path}: weight {name} holds NaN or infinite values")
    tied = ("lm_head.weight", "model.embed_tokens.weight")
    if cfg.tie_word_embeddings and not torch.equal(state[tied[0]], state[tied[1]]):
        raise CheckpointError(f"{path}: its config ties the embeddings, but {tied[0]} differs "
                              f"from {tied[1]}")


def check_metadata(metadata: dict, path) -> None:
    task = metadata.get("task")
    if task is not None and not (isinstance(task, dict) and isinstance(task.get("name"), str)
                                 and isinstance(task.get("params", {}), dict)):
        raise CheckpointError(f"{path} records a task that is not {{name, params}}")


def save_state(path: str | os.PathLike, model: PSATransformer, state: dict, spec: dict,
               task: dict) -> None:
    """A resumable training state: the weights and optimizer after `state["step"]`."""
    payload = {"format": STATE_TAG, "version": FORMAT_VERSION, "config": model.cfg.to_dict(),
               "tokenizer": tokenizer_of(model).json, "metadata": {"spec": spec, "task": task},
               **state}
    data = serialized(payload)
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def read_state(path: str | os.PathLike) -> tuple[PSATransformer, dict]:
    """The model (its weights at the state's step) and the state of a training-state file."""
    payload = read_checkpoint(path, STATE_TAG)
    for key, kind in (("optimizer", dict), ("step", int), ("history", list)):
        if not isinstance(payload.get(key), kind) or isinstance(payload.get(key), bool):
            raise CheckpointError(f"{path} has no {key} of a training state")
    if payload["step"] < 0:
        raise CheckpointError(f"{path} records step {payload['step']}, before the first")
    if not all(is_metrics_row(row) for row in payload["history"]):
        raise CheckpointError(f"{path} has a history row that is not a step's metrics")
    return model_of(payload, path).train(), payload


def is_metrics_row(row) -> bool:
    """A history row as the trainer writes it: its step and metrics, all numbers."""
    return (isinstance(row, dict) and isinstance(row.get("step"), int) and "accuracy" in row
            and all(isinstance(k, str) and isinstance(v, (int, float))
                    and not isinstance(v, bool) for k, v in row.items()))
