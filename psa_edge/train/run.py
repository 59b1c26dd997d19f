"""The train and eval commands' work: progress bar, checkpoint, metrics JSONL, curve PNG.

Contract: `run_training(spec, output)` validates everything (task, preset, variant, gamma,
output directory) before the first step, then writes, each atomically,
`<output stem>.metrics.jsonl`, `<output stem>.curve.png`, the checkpoint and its manifest.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from psa_edge.errors import TaskError
from psa_edge.io import check_writable_dir, write_text
from psa_edge.model.checkpoint import load_checkpoint, save_checkpoint
from psa_edge.tasks import EVAL_SEED, Task, get_task, task_from_dict
from psa_edge.train.trainer import TrainSpec, build_model, evaluate, train

__all__ = ["TrainSpec", "run_training", "evaluate_checkpoint", "sidecar"]


def sidecar(output: Path, suffix: str) -> Path:
    return output.with_name(output.stem + suffix)


def run_training(spec: TrainSpec, output: Path, command: str = "", progress: bool = True) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    output = Path(output)
    check_writable_dir(output)
    build_model(spec, get_task(spec.task, **spec.task_params))  # refuses bad specs up front
    started = time.time()
    with Progress(TextColumn("[bold]train[/] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(),
                  TextColumn("{task.fields[status]}"), disable=not progress) as bar:
        bar_task = bar.add_task(f"{spec.task} {spec.variant}", total=spec.steps, status="")

        def on_step(step: int, loss: float, metrics: dict | None) -> None:
            status = f"loss {loss:.3f}"
            if metrics is not None:
                status += f"  held-out acc {metrics['accuracy']:.3f}"
                bar.update(bar_task, status=status)
            bar.update(bar_task, completed=step)

        result = train(spec, on_step)
    summary = {"accuracy": result.final["accuracy"], "steps_to_90": result.steps_to_90,
               "final": result.final, "wall_seconds": round(time.time() - started, 1)}
    metadata = {"task": result.task.to_dict(), "train": spec.to_dict(), "command": command,
                "summary": summary}
    write_text(sidecar(output, ".metrics.jsonl"),
               "".join(json.dumps(row, sort_keys=True) + "\n" for row in result.history))
    plot_curve(result.history, result.task, spec, sidecar(output, ".curve.png"))
    save_checkpoint(output, result.model, metadata)
    return summary


def plot_curve(history: list[dict], task: Task, spec: TrainSpec, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from psa_edge.io import atomic_output

    steps = [row["step"] for row in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [row["accuracy"] for row in history], marker="o", label="held-out accuracy")
    ax.axhline(0.9, ls="--", c="grey", lw=0.8, label="0.9")
    ax.axhline(task.chance, ls=":", c="red", lw=0.8, label="chance")
    ax.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02),
           title=f"{task.name} · {spec.variant} · {spec.preset} · seed {spec.seed}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def evaluate_checkpoint(checkpoint: Path, task_name: str | None, samples: int,
                        seed: int = EVAL_SEED) -> dict:
    model, metadata = load_checkpoint(checkpoint)
    if task_name is None:
        task = task_from_dict(metadata["task"]) if "task" in metadata else None
        if task is None:
            raise TaskError(f"{checkpoint} records no task; pass --task")
    else:
        task = get_task(task_name, **(metadata.get("task", {}).get("params", {})
                                      if metadata.get("task", {}).get("name") == task_name
                                      else {}))
    if task.vocab_size != model.cfg.vocab_size:
        raise TaskError(f"task {task.name} has vocabulary {task.vocab_size}, "
                        f"the model's is {model.cfg.vocab_size}")
    metrics = evaluate(model, task, samples, seed)
    return {"task": task.name, "samples": samples, "chance": task.chance,
            "variant": model.cfg.variant, **metrics}
