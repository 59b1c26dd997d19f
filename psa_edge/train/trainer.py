"""Training and evaluation of a PSA transformer on a task (an induction benchmark or a text corpus).

Contract:
- `train(spec, task)` is deterministic: the same spec and task give bit-identical weights on the
  same machine and thread count. Step s draws its global batch from (seed, s) alone, so a run
  resumed from its state (`resume`) continues exactly as if uninterrupted, and N data-parallel
  processes (`Replica`: torch.distributed, gloo on the CPU, NCCL on GPUs, as torchrun starts
  them) each take their 1/N share of the same batch: the loss is the sum over each share's
  scored tokens divided by the global batch's count, so the averaged gradients, and the
  weights, are those of one process (to fp32 tolerance).
- Devices: the model and every batch live on `spec.device`; on CUDA the forward runs under bf16
  autocast with fp32 master weights; `spec.compile` wraps the training forward in
  `torch.compile`. The weights handed back are on the CPU, whatever device trained them.
- Held-out evaluation uses the task's test split, which never shares an example (synthetic) or
  a document (text) with training; it reports the task's metrics, the held-out loss and
  perplexity. `steps_to_90` is the first evaluated step whose accuracy reached 0.9 (None for
  text, where no such target exists, or if never reached).
- `on_step(step, loss, eval_metrics_or_None)` lets the main process draw progress;
  `on_state(step, state)` receives the resumable state every `spec.state_every` steps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from psa_edge.errors import CheckpointError, ConfigError
from psa_edge.model import PSATransformer, preset_config
from psa_edge.tasks import EVAL_SEED, IGNORE
from psa_edge.train import check_device

TARGET_ACCURACY = 0.9


@dataclass(frozen=True)
class TrainSpec:
    task: str = "ih-safari"           # a task name, or "text" (then `text` names the corpus)
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
    # ModelConfig fields that override the preset's (e.g. hidden_size, tie_word_embeddings).
    config_overrides: dict = field(default_factory=dict)
    text: tuple[str, ...] = ()
    vocab_size: int | None = None     # text: the BPE vocabulary (default: the preset's)
    device: str = "cpu"
    compile: bool = False
    state_every: int = 0              # steps between resumable states (0: none)
    stop_at: float | None = None      # stop once the held-out accuracy reaches this
    weights_dtype: str = "float32"    # storage precision of the written checkpoint's weights

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["text"] = list(self.text)
        return d


@dataclass
class TrainResult:
    model: PSATransformer
    task: object
    history: list[dict]
    steps_to_90: int | None
    final: dict
    tokens_per_second: float | None = None  # training steps only, after WARM_STEPS


WARM_STEPS = 5  # steps left out of the throughput: allocation, kernel selection, compilation


@dataclass(frozen=True)
class Replica:
    """This process's place in data-parallel training."""
    rank: int = 0
    world: int = 1
    device: str = "cpu"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def start(cls, device: str) -> "Replica":
        """One process (no launcher), or one of torchrun's WORLD_SIZE processes."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls(0, 1, device)
        import torch.distributed as dist

        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if device.startswith("cuda"):
            device = f"cuda:{local}"
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
        return cls(rank, world, device)


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(name)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA GPU is available here (torch sees none)")
    return name


def build_model(spec: TrainSpec, task) -> PSATransformer:
    """The spec's preset for the task's vocabulary and length (and its end-of-text id)."""
    tokenizer = getattr(task, "tokenizer", None)
    overrides = {"num_hidden_layers": spec.layers,
                 "max_position_embeddings": max(task.seq_len, 32),
                 "eos_token_id": tokenizer.eos_id if tokenizer else None,
                 **spec.config_overrides}
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


def autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))


def token_losses(model, inputs: torch.Tensor, targets: torch.Tensor, device: str
                 ) -> torch.Tensor:
    """The summed cross-entropy of the scored tokens (fp32)."""
    with autocast(device):
        logits = model(inputs)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def evaluate(model: PSATransformer, task, samples: int = 512, seed: int = EVAL_SEED,
             batch_size: int = 64, advance: Callable[[int], None] = lambda n: None) -> dict:
    """The task's metrics on `samples` held-out sequences, the held-out loss and perplexity;
    `advance(n)` after each batch of n."""
    model.eval()
    device = next(model.parameters()).device
    inputs, targets = task.sample("test", samples, seed)
    predictions, nll, scored = [], 0.0, 0
    for start in range(0, len(inputs), batch_size):
        x = torch.from_numpy(inputs[start:start + batch_size]).to(device)
        y = torch.from_numpy(targets[start:start + batch_size]).to(device)
        logits = model(x).float()
        predictions.append(logits.argmax(-1).cpu().numpy())
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=IGNORE, reduction="sum").item()
        scored += int((y != IGNORE).sum())
        advance(len(x))
    metrics = task.score(np.concatenate(predictions), targets, inputs)
    loss = nll / max(1, scored)
    return {**metrics, "val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0))}


def make_optimizer(model: PSATransformer, spec: TrainSpec) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98),
                             weight_decay=spec.weight_decay)


ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")


def resumed_optimizer(saved: dict, optimizer: torch.optim.Optimizer, model) -> dict:
    """A training state's AdamW moments, checked against the model (each parameter's moments
    of its shape, finite, the second non-negative, a step count >= 0), under the hyperparameters
    of `optimizer` (the spec's: what the state's own would be, the learning rate being set at
    every step). Refused with CheckpointError, before any step, if they do not fit."""
    fresh = optimizer.state_dict()
    groups, state = saved.get("param_groups"), saved.get("state")
    if (not isinstance(groups, list) or len(groups) != len(fresh["param_groups"])
            or any(not isinstance(g, dict) or g.get("params") != f["params"]
                   for g, f in zip(groups, fresh["param_groups"]))):
        raise CheckpointError("the training state's optimizer has other parameter groups than "
                              "its model")
    shapes = dict(enumerate(p.shape for p in model.parameters()))
    if not isinstance(state, dict) or not set(state) <= set(shapes):
        raise CheckpointError("the training state's optimizer holds moments of no parameter")
    for index, moments in state.items():
        if not fits(moments, shapes[index]):
            raise CheckpointError(f"the training state's optimizer moments of parameter "
                                  f"{index} do not fit it")
    return {"state": state, "param_groups": fresh["param_groups"]}


def fits(moments, shape) -> bool:
    if not isinstance(moments, dict) or set(moments) != set(ADAM_STATE):
        return False
    tensors = [moments[k] for k in ADAM_STATE]
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors):
        return False
    step, first, second = tensors
    return (step.dim() == 0 and first.shape == second.shape == shape
            and all(bool(torch.isfinite(t).all()) for t in tensors)
            and bool(step >= 0) and bool((second >= 0).all()))


def train(spec: TrainSpec, task, on_step: Callable | None = None, model: PSATransformer = None,
          resume: dict | None = None, on_state: Callable | None = None) -> TrainResult:
    """Train `model` (default: the spec's preset, seeded) on `task`; `resume` is a state that
    `on_state` handed out earlier (weights, optimizer, step, history)."""
    replica = Replica.start(spec.device)
    if spec.batch_size % replica.world:
        raise ConfigError(f"--batch-size {spec.batch_size} does not split over "
                          f"{replica.world} processes")
    model = (model or build_model(spec, task)).to(replica.device)
    optimizer = make_optimizer(model, spec)
    history, first = [], 1
    if resume is not None:
        model.load_state_dict(resume["state_dict"])
        optimizer.load_state_dict(resumed_optimizer(resume["optimizer"], optimizer, model))
        history, first = list(resume["history"]), resume["step"] + 1
    step_model = model
    if replica.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model)
    if spec.compile:
        step_model = torch.compile(step_model)
    share = slice(replica.rank * spec.batch_size // replica.world,
                  (replica.rank + 1) * spec.batch_size // replica.world)
    timed_steps, timed_seconds = 0, 0.0
    for step in range(first, spec.steps + 1):
        started = time.perf_counter()
        model.train()
        inputs, targets = task.sample("train", spec.batch_size, spec.seed * 1_000_003 + step)
        scored = int((targets != IGNORE).sum())
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step - 1, spec)
        x, y = (torch.from_numpy(a[share]).to(replica.device) for a in (inputs, targets))
        loss_sum = token_losses(step_model, x, y, replica.device)
        optimizer.zero_grad(set_to_none=True)
        # DDP averages the processes' gradients; the world size undoes that average.
        (loss_sum * (replica.world / scored)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = global_sum(loss_sum.detach(), replica) / scored  # waits for the device
        if step - first >= WARM_STEPS:
            timed_steps, timed_seconds = timed_steps + 1, timed_seconds + time.perf_counter() \
                - started
        metrics = None
        if replica.main and (step % spec.eval_every == 0 or step == spec.steps):
            metrics = evaluate(model, task, spec.eval_samples)
            history.append({"step": step, "loss": loss_value, **metrics})
        if stop_now(spec, metrics, replica):
            break
        if replica.main and on_step is not None:
            on_step(step, loss_value, metrics)
        if replica.main and on_state is not None and spec.state_every \
                and step % spec.state_every == 0 and step < spec.steps:
            on_state(step, {"step": step, "state_dict": cpu_state(model),
                            "optimizer": optimizer.state_dict(), "history": history})
    steps_to_90 = next((row["step"] for row in history if task.name != "text"
                        and row["accuracy"] >= TARGET_ACCURACY), None)
    model = model.to("cpu").eval()
    rate = (timed_steps * spec.batch_size * task.seq_len / timed_seconds if timed_steps
            else None)
    return TrainResult(model, task, history, steps_to_90, history[-1] if history else {}, rate)


def stop_now(spec: TrainSpec, metrics: dict | None, replica: Replica) -> bool:
    """Whether the held-out accuracy reached `spec.stop_at` (decided by the main process)."""
    if spec.stop_at is None:
        return False
    reached = torch.tensor(float(metrics is not None and metrics["accuracy"] >= spec.stop_at),
                           device=replica.device)
    if replica.world > 1:
        import torch.distributed as dist

        dist.broadcast(reached, 0)
    return bool(reached)


def global_sum(value: torch.Tensor, replica: Replica) -> float:
    if replica.world > 1:
        import torch.distributed as dist

        value = value.clone()
        dist.all_reduce(value)
    return float(value)


def cpu_state(model: PSATransformer) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
