"""The train and eval commands' work: what to train, progress bar, checkpoint, metrics, curve.

Contract: `prepare(spec, output, init, resume)` checks and builds everything before the first
step (`PsaEdgeError` on bad input, nothing written): the output directory; the task (an
induction benchmark, or a text corpus: `read_corpus`, a byte-level BPE trained on its training
split, the packed token streams); the model (the spec's preset, seeded; `init`'s weights with the
spec's shear, for fine-tuning; or the weights and optimizer of a training state to `resume`).
`run_training(plan)` trains, the main process drawing a progress bar, and then writes
`<stem>.metrics.jsonl`, `<stem>.curve.png`, the checkpoint (with its tokenizer) and its manifest
all or none (`save_checkpoint`); every `spec.state_every` steps it writes the resumable
`<stem>.state.pt`. Under torchrun every process runs it; only the main one writes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from psa_edge.errors import CheckpointError, ConfigError, TaskError
from psa_edge.io import check_output, manifest_path, refuse_overlap, sha256_file
from psa_edge.model.checkpoint import load_checkpoint, read_state, save_checkpoint, save_state
from psa_edge.model.config import WEIGHT_DTYPES
from psa_edge.model.transformer import PSATransformer
from psa_edge.tasks import EVAL_SEED, SPLITS, get_task, scored_task, task_from_dict
from psa_edge.tokenizer import Tokenizer
from psa_edge.train import check_spec
from psa_edge.train.trainer import Replica, TrainSpec, build_model, evaluate, train

__all__ = ["TrainSpec", "prepare", "run_training", "eval_target", "eval_report", "sidecar"]


def sidecar(output: Path, suffix: str) -> Path:
    return output.with_name(output.stem + suffix)


def outputs_of(output: Path) -> list[Path]:
    """Every file a training run may write."""
    return [output, manifest_path(output), *(sidecar(output, s) for s in
                                             (".metrics.jsonl", ".curve.png", ".state.pt"))]


@dataclass
class Plan:
    spec: TrainSpec
    output: Path
    task: object
    model: object
    state: dict | None
    origin: dict | None  # the checkpoint a fine-tune started from


TEXT_STAGES = ("read corpus", "train BPE", "tokenize")


def text_task(spec: TrainSpec, tokenizer=None, started: Callable[[str], None] = lambda s: None):
    """The corpus of `spec.text` as a task; its BPE trained here unless `tokenizer` is given.
    `started(stage)` as each of `TEXT_STAGES` begins (on the whole standard library they take
    tens of seconds before the first step)."""
    from psa_edge.model.config import PRESETS
    from psa_edge.tasks.text import TextTask, read_corpus
    from psa_edge.tokenizer import train_bpe

    started("read corpus")
    corpus = read_corpus(spec.text)
    if tokenizer is None:
        started("train BPE")
        if spec.preset not in PRESETS:
            raise ConfigError(f"unknown preset {spec.preset!r}; choose one of "
                              f"{', '.join(PRESETS)}")
        # A text vocabulary starts at 512: the 256 bytes and the special token take half.
        vocab = spec.vocab_size or max(512, PRESETS[spec.preset]["vocab_size"])
        tokenizer = Tokenizer(shared(lambda: train_bpe(corpus.split("train"), vocab).json,
                                     spec.device))
    task = TextTask(corpus, tokenizer, spec.task_params.get("seq_len", 256))
    started("tokenize")
    for split in SPLITS:  # a split too short for one sequence is refused now
        task.split_stream(split)
    return task


def shared(make, device: str):
    """`make()` on the main process, the result handed to every torchrun process."""
    from psa_edge.train.trainer import Replica

    replica = Replica.start(device)
    if replica.world == 1:
        return make()
    import torch.distributed as dist

    box = [make() if replica.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def prepare(spec: TrainSpec, output: Path, init: Path | None = None,
            resume: Path | None = None, tokenizer: Path | None = None,
            started: Callable[[str], None] = lambda stage: None) -> Plan:
    """The plan of a run; `started(stage)` as each stage of a text task begins (`text_task`)."""
    output = Path(output)
    if spec.weights_dtype not in WEIGHT_DTYPES:  # refused now, not after the training
        raise ConfigError(f"unknown weights dtype {spec.weights_dtype!r}; choose one of "
                          f"{', '.join(WEIGHT_DTYPES)}")
    for path in outputs_of(output):
        check_output(path)
    refuse_overlap(outputs_of(output)[:-1], [init, resume, tokenizer])
    state = origin = None
    if resume is not None and (init is not None or tokenizer is not None):
        raise ConfigError("--resume continues the run its state records; --init and "
                          "--tokenizer cannot be given with it")
    if resume is not None:
        given_text = spec.text
        spec, model, state = resume_start(resume, spec)
        if given_text is not None and str(given_text) != str(spec.text):
            raise ConfigError(f"--text {given_text} is not the corpus the resumed run records "
                              f"({spec.text}); --resume continues that run")
        task = (text_task(spec, model.tokenizer, started) if spec.text else
                task_from_dict(state["metadata"]["task"]))
    elif init is not None:
        model, origin = fine_tune_start(init, spec)
        task = text_task(spec, model.tokenizer, started) if spec.text else get_task(
            spec.task, **spec.task_params)
    else:
        if tokenizer is not None and not spec.text:
            raise ConfigError("--tokenizer is for text (--text); a task has its own vocabulary")
        given = Tokenizer.from_file(tokenizer) if tokenizer is not None else None
        task = text_task(spec, given, started) if spec.text else get_task(spec.task,
                                                                           **spec.task_params)
        model = build_model(spec, task)  # refuses a bad preset, variant or gamma
        model.tokenizer = getattr(task, "tokenizer", None)
    if task.vocab_size != model.cfg.vocab_size:
        raise TaskError(f"the task's vocabulary is {task.vocab_size}, the model's "
                        f"{model.cfg.vocab_size}")
    return Plan(spec, output, task, model, state, origin)


def resume_start(resume: Path, spec: TrainSpec):
    """The spec a training state recorded (checked as the command line checks its options;
    only the device and compile come from `spec`), its model and its state."""
    model, state = read_state(resume)
    recorded = state["metadata"].get("spec")
    if not isinstance(recorded, dict):
        raise CheckpointError(f"{resume} records no training options")
    check_spec(recorded, str(resume))
    if state["step"] > recorded["steps"]:
        raise CheckpointError(f"{resume} records step {state['step']} of a "
                              f"{recorded['steps']}-step run")
    spec = dataclasses.replace(TrainSpec(**{**recorded, "text": tuple(recorded["text"])}),
                               device=spec.device, compile=spec.compile)
    return spec, model, state


def fine_tune_start(init: Path, spec: TrainSpec):
    """`init`'s weights and tokenizer in a model with the spec's shear (its architecture)."""
    from psa_edge.model.config import gammas_for

    base, _ = load_checkpoint(init)
    gamma_q, gamma_k = gammas_for(spec.variant, spec.gamma)
    model = PSATransformer(base.cfg.replace(gamma_q=gamma_q, gamma_k=gamma_k,
                                            variant=spec.variant))
    model.load_state_dict(base.state_dict())
    model.tokenizer = base.tokenizer
    return model, {"checkpoint": str(init), "sha256": sha256_file(init),
                   "variant": base.cfg.variant, "gamma_k": base.cfg.gamma_k,
                   "gamma_q": base.cfg.gamma_q}


def run_training(plan: Plan, command: str = "", progress: bool = True) -> dict | None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    spec, output = plan.spec, plan.output
    started = time.time()
    state_path = sidecar(output, ".state.pt")
    with Progress(TextColumn("[bold]train[/] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                  TextColumn("{task.fields[status]}"), disable=not progress) as bar:
        bar_task = bar.add_task(f"{plan.task.name} {spec.variant}", total=spec.steps,
                                status="", completed=plan.state["step"] if plan.state else 0)

        def on_step(step: int, loss: float, metrics: dict | None) -> None:
            status = f"loss {loss:.3f}"
            if metrics is not None:
                status += (f"  held-out ppl {metrics['val_perplexity']:.2f}, copy acc "
                           f"{metrics['copy_accuracy']:.3f}" if "copy_accuracy" in metrics
                           else f"  held-out acc {metrics['accuracy']:.3f}")
                bar.update(bar_task, status=status)
            bar.update(bar_task, completed=step)

        def on_state(step: int, state: dict) -> None:
            save_state(state_path, plan.model, state, spec.to_dict(), plan.task.to_dict())

        result = train(spec, plan.task, on_step, plan.model, plan.state, on_state)
    if not Replica.start(spec.device).main:  # torchrun's other processes write nothing
        return None
    summary = {"accuracy": result.final["accuracy"], "steps_to_90": result.steps_to_90,
               "final": result.final, "wall_seconds": round(time.time() - started, 1),
               "steps": result.history[-1]["step"] if result.history else 0,
               "train_tokens_per_second": result.tokens_per_second,
               "device": spec.device, "processes": Replica.start(spec.device).world}
    metadata = {"task": result.task.to_dict(), "train": spec.to_dict(), "command": command,
                "summary": summary, "init": plan.origin}
    metrics = "".join(json.dumps(row, sort_keys=True) + "\n" for row in result.history)
    save_checkpoint(output, result.model, metadata, sidecars={
        sidecar(output, ".metrics.jsonl"): metrics.encode(),
        sidecar(output, ".curve.png"): curve_png(result.history, result.task, spec)},
        weights_dtype=spec.weights_dtype)
    return summary


def curve_png(history: list[dict], task, spec: TrainSpec) -> bytes:
    from io import BytesIO

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [row["accuracy"] for row in history], marker="o", label="held-out accuracy")
    if history and "copy_accuracy" in history[0]:
        ax.plot(steps, [row["copy_accuracy"] for row in history], marker="s",
                label="at copy positions")
        ppl = ax.twinx()
        ppl.plot(steps, [row["val_perplexity"] for row in history], "k--", lw=1,
                 label="held-out perplexity")
        ppl.set(ylabel="perplexity", yscale="log")
        ppl.legend(loc="upper right", fontsize=8)
    else:
        ax.axhline(0.9, ls="--", c="grey", lw=0.8, label="0.9")
    ax.axhline(task.chance, ls=":", c="red", lw=0.8, label="chance")
    ax.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02),
           title=f"{task.name} · {spec.variant} · {spec.preset} · seed {spec.seed}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buffer = BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def eval_target(checkpoint: Path, task_name: str | None) -> tuple[PSATransformer, object]:
    """The checkpoint's model and the task to score it on (the one it recorded by default);
    refused when it records none or the task's vocabulary is not the model's."""
    model, metadata = load_checkpoint(checkpoint)
    task = scored_task(metadata.get("task"), task_name, model.tokenizer, model.cfg.vocab_size,
                       checkpoint)
    return model, task


def eval_report(model: PSATransformer, task, samples: int, seed: int = EVAL_SEED,
                advance: Callable[[int], None] = lambda n: None) -> dict:
    """The eval command's result: the task's metrics on `samples` held-out sequences."""
    metrics = evaluate(model, task, samples, seed, advance=advance)
    return {"task": task.name, "samples": samples, "chance": task.chance,
            "variant": model.cfg.variant, **metrics}

