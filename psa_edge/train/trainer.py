"""Training and evaluation of a PSA transformer on an induction task.

Contract:
- `train(spec)` is deterministic: the same `TrainSpec` gives bit-identical weights on the same
  machine (seeded init, seeded data, deterministic CPU kernels).
- Held-out evaluation uses the task's test split, which never shares an example with training.
- `steps_to_90` is the first evaluated step whose held-out accuracy reached 0.9, or None.
- `on_step(step, loss, eval_metrics_or_None)` lets a caller draw progress; it is never required.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from psa_edge.model import PSATransformer, preset_config
from psa_edge.tasks import EVAL_SEED, IGNORE, Task, get_task

TARGET_ACCURACY = 0.9


@dataclass(frozen=True)
class TrainSpec:
    task: str = "ih-safari"
    preset: str = "tiny"
    variant: str = "key-only"
    gamma: float | None = None
    layers: int | None = None
    steps: int = 1000
    seed: int = 0
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup: int = 50
    eval_every: int = 100
    eval_samples: int = 512
    task_params: dict = field(default_factory=dict)
    # ModelConfig fields that override the preset's (e.g. hidden_size, num_attention_heads).
    config_overrides: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class TrainResult:
    model: PSATransformer
    task: Task
    history: list[dict]
    steps_to_90: int | None
    final: dict


def build_model(spec: TrainSpec, task: Task) -> PSATransformer:
    overrides = {"num_hidden_layers": spec.layers,
                 "max_position_embeddings": max(task.seq_len, 32), **spec.config_overrides}
    cfg = preset_config(spec.preset, spec.variant, spec.gamma, vocab_size=task.vocab_size,
                        **overrides)
    torch.manual_seed(spec.seed)
    return PSATransformer(cfg)


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_on(model: PSATransformer, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE)


@torch.no_grad()
def predict(model: PSATransformer, inputs: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Argmax next-token predictions `[n, T]` of the full-sequence forward."""
    model.eval()
    out = []
    for start in range(0, len(inputs), batch_size):
        chunk = torch.from_numpy(inputs[start:start + batch_size])
        out.append(model(chunk).argmax(-1).numpy())
    return np.concatenate(out)


def evaluate(model: PSATransformer, task: Task, samples: int = 512, seed: int = EVAL_SEED) -> dict:
    inputs, targets = task.sample("test", samples, seed)
    return task.score(predict(model, inputs), targets)


def train(spec: TrainSpec, on_step: Callable[[int, float, dict | None], None] | None = None
          ) -> TrainResult:
    task = get_task(spec.task, **spec.task_params)
    model = build_model(spec, task)
    eval_inputs, eval_targets = task.sample("test", spec.eval_samples, EVAL_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98),
                                  weight_decay=spec.weight_decay)
    history: list[dict] = []
    steps_to_90 = None
    for step in range(1, spec.steps + 1):
        model.train()
        # Each step draws its own batch from (seed, step), so a run can be replayed exactly.
        inputs, targets = task.sample("train", spec.batch_size, spec.seed * 1_000_003 + step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step - 1, spec)
        loss = loss_on(model, torch.from_numpy(inputs), torch.from_numpy(targets))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = loss.item()
        metrics = None
        if step % spec.eval_every == 0 or step == spec.steps:
            metrics = task.score(predict(model, eval_inputs), eval_targets)
            if steps_to_90 is None and metrics["accuracy"] >= TARGET_ACCURACY:
                steps_to_90 = step
            history.append({"step": step, "loss": loss_value, **metrics})
        if on_step is not None:
            on_step(step, loss_value, metrics)
    return TrainResult(model, task, history, steps_to_90, history[-1])
