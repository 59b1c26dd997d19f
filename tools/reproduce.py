"""Reproduce the paper's claims on this machine: docs/results/reproduction.md with its plots.

Its parts: the variant table beside the paper's numbers (runs of `--variants`); a gamma sweep
of 1-layer key-only models on ih-sht at several d_k and T against the closed-form critical
coupling gamma_c(d_k, T); the negative control ih-offset (no predecessor lookup needed: the
shear should not help); the frequency response of the default model's score stream against
H(omega) = 1 + gamma (1 - e^{-i omega}), shear post-RoPE (as built) and pre-RoPE; the deep model.

    .venv/bin/python tools/reproduce.py --variants  # docs/results/variants.md (~2 h)
    .venv/bin/python tools/reproduce.py --throughput [cuda]  # docs/results/training.md (~10 min)
    .venv/bin/python tools/reproduce.py --deep cpu  # the deep-model runs (~1 h, 2 cores)
    .venv/bin/python tools/reproduce.py          # the page, from cached and new runs (hours)

Runs are single-threaded, cached as JSON in docs/results/reproduction/runs/ (delete one to
rerun it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import REPO, machine, mean_std, write_block, write_doc

from psa_edge import theory

PAPER = {"key-only": 0.949, "symmetric": 0.811, "query-only": "chance",
         "steps": "717 (gamma 0.8) vs 2700 (gamma 0), 91.3M parameters"}
SWEEP_WIDTH = 128  # hidden size of every sweep model; d_k varies through the head count


@dataclass(frozen=True)
class Plan:
    out: Path
    sweep_settings: tuple              # (d_k, T) pairs
    gammas: tuple
    seeds: tuple                       # of the sweep
    sweep_steps: int
    control_gammas: tuple
    control_seeds: tuple
    control_steps: int


PLAN = Plan(REPO / "docs" / "results" / "reproduction.md",
            ((16, 64), (64, 64), (16, 128), (64, 128)),
            (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5), (0, 1), 1000,
            (0.0, 0.2, 0.4, 0.8, 1.2), (0, 1, 2), 150)


def runs_dir(plan: Plan) -> Path:
    return plan.out.parent / plan.out.stem / "runs"


# ---------------------------------------------------------------------------------------------
# Training jobs: a job is (file name, TrainSpec fields); the result is cached as JSON.

def sweep_job(d_k: int, T: int, gamma: float, seed: int, steps: int) -> tuple[str, dict]:
    heads = SWEEP_WIDTH // d_k
    spec = dict(task="ih-sht", preset="tiny", variant="key-only" if gamma else "baseline",
                gamma=gamma or None, layers=1, steps=steps, seed=seed, eval_every=100,
                eval_samples=256, task_params={"seq_len": T, "alphabet": 64},
                config_overrides={"hidden_size": SWEEP_WIDTH, "intermediate_size": 256,
                                  "num_attention_heads": heads, "num_key_value_heads": heads})
    return f"sweep_dk{d_k}_T{T}_g{gamma:g}_s{seed}_{steps}st.json", spec


CONTROL_TASK = {"seq_len": 64, "num_ordinary": 32, "max_offset": 8}


def control_job(gamma: float, seed: int, steps: int) -> tuple[str, dict]:
    # Evaluated every 5 steps: every gamma solves it, so the comparison is how fast.
    spec = dict(task="ih-offset", preset="tiny", variant="key-only" if gamma else "baseline",
                gamma=gamma or None, layers=1, steps=steps, seed=seed, eval_every=5,
                task_params=CONTROL_TASK)
    return f"control_g{gamma:g}_s{seed}_{steps}st.json", spec


# The deep-model experiment (the paper: 91.3M parameters, induction in 3/3 seeds at gamma 0.8
# after 717 steps, 2/3 at gamma 0 after 2700): ih-sht, gamma 0 against key-only 0.8, 3 seeds,
# steps to 0.9 evaluated every 50 steps (training stops there), up to 3000 steps.
DEEP = {"gpu": dict(preset="psa-92m", layers=12, lr=1e-3, device="cuda", steps=3000),
        "cpu": dict(preset="psa-4m", layers=3, lr=1e-3, device="cpu", steps=2000,
                    batch_size=16, eval_samples=128, task_params={"seq_len": 128, "alphabet": 64})}
DEEP_GAMMAS, DEEP_SEEDS = (0.0, 0.8), (0, 1, 2)
THROUGHPUT = REPO / "docs" / "results" / "training"  # one JSON per (preset, device, processes)
THROUGHPUT_STEPS = {"cpu": 8, "cuda": 200}


def throughput(devices: list[str]) -> None:
    """docs/results/training.md: `psa-edge train` tokens/s of psa-4m and psa-30m, on the CPU with 1
    and 2 processes (the same cores: 2 threads against 2 x 1) and on a GPU where asked."""
    import subprocess
    import sys
    import tempfile

    THROUGHPUT.mkdir(parents=True, exist_ok=True)
    for device, preset in [(d, p) for d in devices for p in ("psa-4m", "psa-30m")]:
        for nproc in (1, 2) if device == "cpu" else (1,):
            cached = THROUGHPUT / f"{preset}-{device}-{nproc}p.json"  # delete it to remeasure
            if cached.exists():
                continue
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([sys.executable, "-m", "psa_edge.cli", "train", "--task", "ih-sht",
                                "--preset", preset, "--seq-len", "256", "--batch-size", "32",
                                "--steps", str(THROUGHPUT_STEPS[device]), "--eval-every", "100000",
                                "--eval-samples", "8", "--device", device, "--nproc", str(nproc),
                                "-o", f"{tmp}/m.pt"], check=True, env={
                                    **os.environ, "OMP_NUM_THREADS": str(2 // nproc)})
                summary = json.loads(Path(f"{tmp}/m.pt.json").read_text())["metadata"]["summary"]
            cached.write_text(json.dumps({"preset": preset, "device": device, "processes": nproc,
                                          "machine": machine(),
                                          "tokens_per_second": summary["train_tokens_per_second"]}))
    rows = [json.loads(p.read_text()) for p in sorted(THROUGHPUT.glob("*.json"))]
    write_doc("training.md", f"""# Training throughput

Made by `.venv/bin/python tools/reproduce.py --throughput [cuda]`: `psa-edge train` on ih-sht
(256 tokens a sequence, vocabulary 64, batch 32 over all processes, key-only gamma_k 0.8),
{THROUGHPUT_STEPS['cpu']} steps on a CPU, {THROUGHPUT_STEPS['cuda']} on a GPU; tokens/s is the
trainer's own count over its steps after the first five (evaluation left out). CPU: `--nproc 2`
(torchrun, gloo, a thread each) against 1 process with 2 threads, the same cores. CUDA: bf16
autocast, fp32 master weights.

| preset | device | processes | tokens/s | machine |
|---|---|---|---|---|
""" + "\n".join(f"| {r['preset']} | {r['device']} | {r['processes']} | "
                f"{r['tokens_per_second']:,.0f} | {r['machine']} |" for r in rows))


def deep_section(plan: Plan, size: str) -> str:
    """The deep-model table of one size from its cached runs, or how to make them."""
    spec = deep_job(size, 0.8, 0)[1]
    paths = {(g, s): runs_dir(plan) / deep_job(size, g, s)[0] for g in DEEP_GAMMAS
             for s in DEEP_SEEDS}
    what = (f"`{spec['preset']}` ({spec['layers']} layers) on ih-sht (length "
            f"{spec.get('task_params', {}).get('seq_len', 256)}), batch {spec['batch_size']}, lr "
            f"{spec['lr']}, evaluated every 50 steps on {spec['eval_samples']} held-out "
            f"sequences, up to {spec['steps']} steps, on {spec['device']}")
    command = f"`.venv/bin/python tools/reproduce.py --deep {size} --jobs N`"
    if not all(p.exists() for p in paths.values()):
        flops = 6 * 92e6 * len(paths) * spec["steps"] * spec["batch_size"] * 256
        return (f"**{size.upper()}-sized** ({what}): {sum(p.exists() for p in paths.values())} "
                f"of {len(paths)} runs made for this page; the command is {command}." + (
                    f" Expected time, not measured: 6 FLOPs x 92M parameters x {len(paths)} "
                    f"runs x {spec['steps']} steps x {spec['batch_size']} x 256 tokens = "
                    f"{flops:.1e} FLOPs, {flops / 1e14 / 60:.0f} min at a sustained 100 TFLOP/s "
                    f"(a tenth of an H100's bf16 peak); stopping at 0.9 shortens it."
                    if size == "gpu" else ""))
    runs = {k: json.loads(p.read_text()) for k, p in paths.items()}
    lines = [f"**{size.upper()}-sized** ({what}; {command}, "
             f"{sum(r['wall_seconds'] for r in runs.values()) / 60:.0f} min of training summed "
             f"over runs):", "",
             "| gamma_k | steps to 0.9, seeds " + ", ".join(map(str, DEEP_SEEDS)) +
             " | reached 0.9 | mean steps (seeds that reached) | final accuracy |",
             "|---|---|---|---|---|"]
    for g in DEEP_GAMMAS:
        rows = [runs[(g, s)] for s in DEEP_SEEDS]
        steps = [r["steps_to_90"] for r in rows]
        reached = [x for x in steps if x is not None]
        lines.append(f"| {g:g} | {' / '.join(str(x) if x else '-' for x in steps)} | "
                     f"{len(reached)}/{len(rows)} | "
                     f"{statistics.mean(reached):.0f} |" if reached else
                     f"| {g:g} | {' / '.join('-' for _ in steps)} | 0/{len(rows)} | - |")
        lines[-1] += " " + " / ".join(f"{r['accuracy']:.3f}" for r in rows) + " |"
    return "\n".join(lines)


def deep_job(size: str, gamma: float, seed: int) -> tuple[str, dict]:
    spec = dict(task="ih-sht", variant="key-only" if gamma else "baseline", gamma=gamma or None,
                seed=seed, eval_every=50, warmup=100, stop_at=0.9,
                **{"eval_samples": 256, "batch_size": 32, **DEEP[size]})
    return f"deep-{size}_g{gamma:g}_s{seed}.json", spec


def run_job(job: tuple[str, dict, str]) -> dict:
    import torch

    from psa_edge.tasks import get_task
    from psa_edge.train.trainer import TrainSpec, train

    torch.set_num_threads(1)
    name, fields, folder = job
    started = time.time()
    spec = TrainSpec(**fields)
    result = train(spec, get_task(spec.task, **spec.task_params))
    row = {"spec": spec.to_dict(), "accuracy": result.final["accuracy"],
           "last_accuracy": result.final["last_accuracy"], "steps_to_90": result.steps_to_90,
           "final_loss": result.history[-1]["loss"], "chance": result.task.chance,
           "history": result.history, "wall_seconds": round(time.time() - started, 1),
           "tokens_per_second": result.tokens_per_second}
    (Path(folder) / name).write_text(json.dumps(row, indent=1))
    return row


def run_all(jobs: list[tuple[str, dict]], folder: Path, n_jobs: int) -> dict[str, dict]:
    """Train the jobs not cached in `folder`; the wall time of every invocation that trained is
    added to `folder/wall.json`, so a later re-render from cache still reports it."""
    folder.mkdir(parents=True, exist_ok=True)
    todo = [(name, spec, str(folder)) for name, spec in jobs if not (folder / name).exists()]
    print(f"{len(jobs) - len(todo)} runs cached, {len(todo)} to train", flush=True)
    started = time.time()
    import multiprocessing

    # spawn: a CUDA context does not survive fork, and a forked OpenMP pool can deadlock
    with ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for i, row in enumerate(pool.map(run_job, todo), 1):
            s = row["spec"]
            print(f"[{i}/{len(todo)}] {s['task']} {s['variant']} gamma {s['gamma']} seed "
                  f"{s['seed']}: acc {row['accuracy']:.3f} ({row['wall_seconds']} s, "
                  f"{(time.time() - started) / 60:.1f} min so far)", flush=True)
    if todo:
        wall = folder / "wall.json"
        spent = json.loads(wall.read_text()) if wall.exists() else {"seconds": 0.0, "jobs": []}
        spent["seconds"] += time.time() - started
        spent["jobs"].append(n_jobs)
        wall.write_text(json.dumps(spent))
    return {name: json.loads((folder / name).read_text()) for name, _ in jobs}


def training_wall_minutes(plan: Plan) -> float:
    wall = runs_dir(plan) / "wall.json"
    return json.loads(wall.read_text())["seconds"] / 60 if wall.exists() else 0.0


# ---------------------------------------------------------------------------------------------
# 1. Variant table

VARIANT_ROWS = [("baseline, 1 layer", "baseline", 1), ("baseline, 2 layers", "baseline", 2),
                ("key-only (gamma_k 0.8), 1 layer", "key-only", 1),
                ("symmetric (gamma 0.8), 1 layer", "symmetric", 1),
                ("query-only (gamma_q 0.8), 1 layer", "query-only", 1)]
VARIANTS = REPO / "docs" / "results" / "variants"  # the full table's runs (--variants trains them)
TABLE_SEEDS = (0, 1, 2)
TABLE_SETTINGS = {  # task -> TrainSpec fields shared by its runs
    "ih-safari": dict(preset="tiny", steps=1000, eval_every=50, batch_size=32, lr=3e-3),
    "ih-sht": dict(preset="psa-0.5m", steps=1000, eval_every=100, batch_size=32, lr=3e-3,
                   eval_samples=256),
}
ACCURACY = {"ih-safari": "at the final trigger",
            "ih-sht": "over every position whose token occurred before"}


def table_job(task: str, variant: str, layers: int, seed: int) -> tuple[str, dict]:
    return (f"{task}_{variant}_{layers}L_seed{seed}.json",
            dict(task=task, variant=variant, layers=layers, seed=seed, **TABLE_SETTINGS[task]))


def variant_results(n_jobs: int, train: bool = False) -> tuple[str, dict]:
    """(how the runs were made, {task: {(variant, layers): [runs]}})."""
    jobs = [table_job(t, v, layers, s) for t in TABLE_SETTINGS for _, v, layers in VARIANT_ROWS
            for s in TABLE_SEEDS]
    if not train and not all((VARIANTS / name).exists() for name, _ in jobs):
        raise SystemExit("variant-table runs are missing; run "
                         ".venv/bin/python tools/reproduce.py --variants first")
    rows = run_all(jobs, VARIANTS, n_jobs)
    source = "; ".join(f"{t} on `{c['preset']}`, {c['steps']} steps, batch {c['batch_size']}, "
                       f"lr {c['lr']}, accuracy {ACCURACY[t]}" for t, c in TABLE_SETTINGS.items())
    results: dict = {}
    for name, spec in jobs:
        results.setdefault(spec["task"], {}).setdefault(
            (spec["variant"], spec["layers"]), []).append(rows[name])
    return f"{source}; mean ± std over seeds {', '.join(map(str, TABLE_SEEDS))}", results


def steps_to(run: dict, threshold: float) -> int | None:
    """First evaluated step whose held-out accuracy reached `threshold` (from the run's curve)."""
    return next((row["step"] for row in run["history"] if row["accuracy"] >= threshold), None)


def steps_text(runs: list[dict], threshold: float = 0.9) -> str:
    reached = [s for s in (steps_to(r, threshold) for r in runs) if s is not None]
    if not reached:
        return "not reached"
    text = f"{statistics.mean(reached):.0f}"
    return text if len(reached) == len(runs) else f"{text} ({len(reached)}/{len(runs)} seeds)"


def variant_section(source: str, results: dict) -> str:
    paper = {"key-only": "0.949", "symmetric": "0.811", "query-only": "chance"}
    lines = [f"Source: {source}.", ""]
    verdicts = []
    for task, rows in results.items():
        chance = next(iter(rows.values()))[0]["chance"]
        lines += [f"**{task}** (chance {chance:.3f})", "",
                  "| model | accuracy | per seed | last position | steps to 0.9 | paper |",
                  "|---|---|---|---|---|---|"]
        for label, variant, layers in VARIANT_ROWS:
            runs = rows[(variant, layers)]
            acc = [r["accuracy"] for r in runs]
            lines.append(f"| {label} | {mean_std(acc)} | {' / '.join(f'{a:.3f}' for a in acc)} | "
                         f"{mean_std([r['last_accuracy'] for r in runs])} | {steps_text(runs)} "
                         f"| {paper.get(variant, '') if layers == 1 else ''} |")
        lines.append("")
        key_only = min(r["accuracy"] for r in rows[("key-only", 1)])
        controls = max(r["accuracy"] for v in ("baseline", "query-only") for r in rows[(v, 1)])
        verdicts.append(f"- {task}: key-only >= 0.95 on every seed: "
                        f"{'yes' if key_only >= 0.95 else 'NO'} (lowest {key_only:.3f}); 1-layer "
                        f"baseline and query-only within 5 points of chance on every seed: "
                        f"{'yes' if controls <= chance + 0.05 else 'NO'} (highest "
                        f"{controls:.3f}, chance {chance:.3f}).")
    return "\n".join(lines + ["What the table shows, computed from the runs above:", ""]
                     + verdicts) + "\n"


# ---------------------------------------------------------------------------------------------
# 2. Gamma sweep against gamma_c

ONSET_ACCURACY = 0.5
SWEEP_STEPS_THRESHOLD = 0.8  # T = 64 models plateau near 0.9 within the step budget


def onset(gammas: list[float], accuracies: list[float]) -> float | None:
    """The gamma where mean accuracy first reaches ONSET_ACCURACY, linearly interpolated
    between the swept points; None if it never does."""
    for i, (g, a) in enumerate(zip(gammas, accuracies)):
        if a >= ONSET_ACCURACY:
            if i == 0:
                return g
            g0, a0 = gammas[i - 1], accuracies[i - 1]
            return g0 + (ONSET_ACCURACY - a0) / (a - a0) * (g - g0)
    return None


def sweep_table(plan: Plan, rows: dict) -> tuple[str, dict]:
    summary = {}
    lines = ["| d_k | T | heads | " + " | ".join(f"gamma {g:g}" for g in plan.gammas)
             + " | measured onset | gamma_c | onset / gamma_c |",
             "|---|---|---|" + "---|" * len(plan.gammas) + "---|---|---|"]
    for d_k, T in plan.sweep_settings:
        accs, steps = [], []
        for g in plan.gammas:
            runs = [rows[sweep_job(d_k, T, g, s, plan.sweep_steps)[0]] for s in plan.seeds]
            accs.append(statistics.mean(r["accuracy"] for r in runs))
            steps.append(steps_text(runs, SWEEP_STEPS_THRESHOLD))
        measured, critical = onset(list(plan.gammas), accs), theory.gamma_c(d_k, T)
        summary[(d_k, T)] = {"accuracy": accs, "steps": steps, "onset": measured,
                             "gamma_c": critical}
        cells = " | ".join(f"{a:.3f}" for a in accs)
        ratio = f"{measured / critical:.2f}" if measured is not None else "-"
        lines.append(f"| {d_k} | {T} | {SWEEP_WIDTH // d_k} | {cells} | "
                     f"{'none' if measured is None else f'{measured:.2f}'} | {critical:.3f} | "
                     f"{ratio} |")
    lines += ["", f"Steps to {SWEEP_STEPS_THRESHOLD} held-out accuracy (evaluated every 100 steps; "
              "mean over the seeds that reached it):", "",
              "| d_k | T | " + " | ".join(f"gamma {g:g}" for g in plan.gammas) + " |",
              "|---|---|" + "---|" * len(plan.gammas)]
    for (d_k, T), s in summary.items():
        lines.append(f"| {d_k} | {T} | " + " | ".join(s["steps"]) + " |")
    return "\n".join(lines), summary


def plot_sweep(plan: Plan, summary: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, ((d_k, T), s) in enumerate(summary.items()):
        colour = f"C{i}"
        ax.plot(plan.gammas, s["accuracy"], marker="o", color=colour, label=f"d_k={d_k}, T={T}")
        ax.axvline(s["gamma_c"], color=colour, ls="--", lw=0.9)
    ax.axhline(ONSET_ACCURACY, color="grey", ls=":", lw=0.8)
    ax.set(xlabel="gamma_k", ylabel="held-out accuracy (ih-sht)", ylim=(0, 1.02),
           title="1-layer key-only sweep; dashed: closed-form gamma_c(d_k, T)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# 3. Negative control

def control_table(plan: Plan, rows: dict) -> tuple[str, float]:
    lines = ["| gamma_k | accuracy (mean ± std) | steps to 0.9 | final training loss |",
             "|---|---|---|---|"]
    ranking = []
    for g in plan.control_gammas:
        runs = [rows[control_job(g, s, plan.control_steps)[0]] for s in plan.control_seeds]
        acc = statistics.mean(r["accuracy"] for r in runs)
        reached = [s for s in (steps_to(r, 0.9) for r in runs) if s is not None]
        loss = statistics.mean(r["final_loss"] for r in runs)
        # Best: highest accuracy, then fewest steps to 0.9, then lowest loss.
        ranking.append((-round(acc, 3), statistics.mean(reached) if reached else 1e9, loss, g))
        lines.append(f"| {g:g} | {mean_std([r['accuracy'] for r in runs])} | {steps_text(runs)} "
                     f"| {loss:.4f} |")
    return "\n".join(lines), min(ranking)[3]


# ---------------------------------------------------------------------------------------------
# 4. Frequency response of the trained model's score stream

def score_streams(checkpoint: Path, samples: int = 16):
    """(raw, post-RoPE-sheared, pre-RoPE-sheared) score streams s_{T-1, j} over j, one row per
    (sequence, head), of a trained model on held-out data of its task."""
    import torch

    from psa_edge.model.checkpoint import load_checkpoint
    from psa_edge.model.ops import apply_rope, rope_cos_sin, shear
    from psa_edge.tasks import task_from_dict

    model, metadata = load_checkpoint(checkpoint)
    task = task_from_dict(metadata["task"])
    inputs, _ = task.sample("test", samples, seed=99)
    cfg, layer = model.cfg, model.model.layers[0]
    attn = layer.self_attn
    with torch.no_grad():
        x = layer.input_layernorm(model.model.embed_tokens(torch.from_numpy(inputs)))
        positions = torch.arange(inputs.shape[1])
        cos, sin = rope_cos_sin(positions, model.inv_freq)
        query, key, _ = attn.project(x, cos, sin)
        raw_key = attn._heads(attn.k_proj(x), cfg.num_key_value_heads)
        zero = torch.zeros_like(key[..., :1, :])
        post = shear(key, zero, cfg.gamma_k)
        pre = apply_rope(shear(raw_key, zero, cfg.gamma_k), cos, sin)
        q_last = query[:, :, -1:, :]  # the last query against every key: s_{T-1, j}
        streams = [(q_last @ k.transpose(-1, -2))[:, :, 0, :].reshape(-1, inputs.shape[1])
                   for k in (key, post, pre)]
    return [s.double().numpy() for s in streams], cfg.gamma_k


def measured_response(inp: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """H(omega) = <conj(X) Y> / <|X|^2> over rows (Welch-style cross-spectral estimate)."""
    window = np.hanning(inp.shape[1])
    X = np.fft.rfft((inp - inp.mean(1, keepdims=True)) * window, axis=1)
    Y = np.fft.rfft((out - out.mean(1, keepdims=True)) * window, axis=1)
    omega = np.linspace(0, np.pi, X.shape[1])
    return omega, (np.conj(X) * Y).mean(0) / (np.abs(X) ** 2).mean(0)


def frequency_section(checkpoint: Path, path: Path) -> tuple[str, dict]:
    import matplotlib.pyplot as plt

    (raw, post, pre), gamma = score_streams(checkpoint)
    omega, h_post = measured_response(raw, post)
    _, h_pre = measured_response(raw, pre)
    closed = np.abs(theory.transfer(omega, gamma))
    band = omega > 0  # the mean is removed, so DC carries no estimate
    stats = {}
    for name, h in (("post-RoPE (as built)", h_post), ("pre-RoPE (wrong placement)", h_pre)):
        mag = np.abs(h[band])
        stats[name] = {"r": float(np.corrcoef(mag, closed[band])[0, 1]),
                       "max_rel_err": float(np.max(np.abs(mag - closed[band]) / closed[band]))}
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(omega, closed, "k-", lw=2, label=f"closed form |1 + {gamma:g}(1 - e^-iw)|")
    ax.plot(omega, np.abs(h_post), "C0.", ms=3, label="measured, post-RoPE shear")
    ax.plot(omega, np.abs(h_pre), "C3.", ms=3, label="measured, pre-RoPE shear")
    ax.set(xlabel="omega (rad / token)", ylabel="|H(omega)|",
           title=f"score stream of {checkpoint.name}: gain of the shear")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    lines = [f"Model: `{checkpoint.relative_to(REPO)}` (key-only, gamma_k = {gamma:g}), 16 "
             f"held-out ih-sht sequences x {raw.shape[0] // 16} heads; stream s_(T-1, j) = "
             f"q_(T-1) . k_j over j = 0..{raw.shape[1] - 1}; Hann window, cross-spectral "
             f"estimate.", "",
             "| shear placement | correlation r of measured vs closed-form gain | max relative "
             "error |", "|---|---|---|"]
    lines += [f"| {name} | {s['r']:.4f} | {s['max_rel_err']:.3f} |" for name, s in stats.items()]
    return "\n".join(lines), stats


# ---------------------------------------------------------------------------------------------

def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--deep", choices=sorted(DEEP), help="only the deep runs of a size")
    parser.add_argument("--runs", type=Path, help="--deep: its cache (default: the page's)")
    parser.add_argument("--steps", type=int, help="--deep: fewer steps (a dry run)")
    parser.add_argument("--throughput", nargs="*", metavar="DEVICE", help="only "
                        "docs/results/training.md (tokens/s): the CPU and the DEVICEs named")
    parser.add_argument("--variants", action="store_true", help="only docs/results/variants.md")
    args = parser.parse_args()
    plan = PLAN
    if args.throughput is not None:
        return throughput(["cpu", *args.throughput])
    if args.variants:
        body = variant_section(*variant_results(args.jobs, train=True))
        write_doc("variants.md", f"# Variant table\n\nMade by `.venv/bin/python tools/"
                  f"reproduce.py --variants` on {machine()}; per-run specs and held-out curves "
                  f"in `docs/results/variants/*.json`. The paper: key-only "
                  f"{PAPER['key-only']}, symmetric {PAPER['symmetric']}, query-only at "
                  f"{PAPER['query-only']}.\n\n{body}")
        write_block("variants", body)
        return
    if args.deep:
        jobs = [deep_job(args.deep, g, s) for g in DEEP_GAMMAS for s in DEEP_SEEDS]
        jobs = [(name, {**spec, "steps": args.steps or spec["steps"]}) for name, spec in jobs]
        run_all(jobs, args.runs or runs_dir(plan), args.jobs)
        return
    started = time.time()
    figures = plan.out.parent / plan.out.stem
    figures.mkdir(parents=True, exist_ok=True)

    source, variants = variant_results(args.jobs)
    sweep_jobs = [sweep_job(d, T, g, s, plan.sweep_steps) for d, T in plan.sweep_settings
                  for g in plan.gammas for s in plan.seeds]
    control_jobs = [control_job(g, s, plan.control_steps) for g in plan.control_gammas
                    for s in plan.control_seeds]
    rows = run_all(sweep_jobs + control_jobs, runs_dir(plan), args.jobs)

    sweep_md, summary = sweep_table(plan, rows)
    plot_sweep(plan, summary, figures / "gamma-sweep.png")
    control_md, best = control_table(plan, rows)
    freq_md, freq = frequency_section(REPO / "models" / "psa-default.pt",
                                      figures / "frequency-response.png")
    deep_md = "\n\n".join(deep_section(plan, size) for size in ("cpu", "gpu"))
    train_minutes = sum(r["wall_seconds"] for r in rows.values()) / 60
    rel = lambda p: os.path.relpath(p, plan.out.parent)  # noqa: E731
    doc = render(plan, source, variants, sweep_md, summary, control_md, best, freq_md, freq,
                 rel(figures / "gamma-sweep.png"), rel(figures / "frequency-response.png"),
                 train_minutes, training_wall_minutes(plan), deep_md)
    plan.out.parent.mkdir(parents=True, exist_ok=True)
    plan.out.write_text(doc)
    write_readme_block(summary, best, freq)
    print(f"wrote {plan.out} in {(time.time() - started) / 60:.1f} min")


def render(plan, source, variants, sweep_md, summary, control_md, best, freq_md, freq,
           sweep_png, freq_png, train_minutes, wall_minutes, deep_md) -> str:
    command = ".venv/bin/python tools/reproduce.py"
    settings = ", ".join(f"(d_k={d}, T={T})" for d, T in plan.sweep_settings)
    crossings = [s for s in summary.values() if s["onset"] is not None]
    below = sum(1 for s in crossings if s["onset"] < s["gamma_c"])
    never = len(summary) - len(crossings)
    sweep_verdict = (f"The measured onset is below gamma_c in {below} of {len(summary)} settings"
                     + (f"; {never} setting(s) never reached accuracy {ONSET_ACCURACY}." if never
                        else "."))
    control_verdict = ("The best gamma is 0, as the paper reports." if best == 0 else
                       f"The best gamma here is {best:g}, not 0: this disagrees with the paper's "
                       f"negative control (see the table: the differences are small).")
    post = freq["post-RoPE (as built)"]["r"]
    return f"""# Reproducing the paper's claims

Made by `{command}` on {machine()}. Training wall time
{wall_minutes:.0f} min (the invocations that trained;
`{runs_dir(plan).relative_to(REPO)}/wall.json`),
{train_minutes:.0f} min of single-threaded training summed over this page's runs (excluding
the variant table's cached runs). Per-run specs, curves and results:
`{runs_dir(plan).relative_to(REPO)}/*.json`.
Paper numbers are from *Phase Space Attention: A Hairer Lift Circumvents the Single-Layer
Induction Obstruction* (Maitra, Sood, Hosseini, Gunnala, Gupta, 2026).

## 1. Variant table

{variant_section(source, variants)}
The paper: key-only {PAPER['key-only']}, symmetric {PAPER['symmetric']}, query-only
{PAPER['query-only']}; steps for induction to emerge {PAPER['steps']}.

## 2. Gamma sweep against the closed-form critical coupling

1-layer key-only models (gamma = 0 is the plain baseline) on ih-sht (alphabet 64), hidden size
{SWEEP_WIDTH}, d_k set by the head count, {plan.sweep_steps} steps, seeds
{', '.join(map(str, plan.seeds))}; held-out accuracy (mean over seeds) at settings {settings}.
gamma_c = sqrt(2L / (sqrt(d_k) + sqrt(d_k - 8L))) for d_k >= 8L, else
sqrt(1 / (2 c^2 sqrt(2L))), L = log(T - 1), c = 0.74. The measured onset is the gamma where
mean accuracy first reaches {ONSET_ACCURACY} (linear interpolation between swept points).

{sweep_md}

![gamma sweep]({sweep_png})

{sweep_verdict} The paper reports the trained onset below gamma_c (its gamma_c is an upper
bound for trained models). The sweep trains key-only models, the paper's accuracy-optimal
variant; the closed form is derived for a reduced Gaussian score model, not for this trainer.

## 3. Negative control: ih-offset

ih-offset (`psa_edge/tasks/induction.py`, {CONTROL_TASK}): ih-safari's layout, but the answer
is a marked token at a random offset 1..max_offset after the trigger, found by its own content,
so plain single-layer attention can solve it without a predecessor lookup. The paper's
randomized-offset task is not specified in its summary; this is this project's reading of it.
1-layer `tiny` models, {plan.control_steps} steps, held-out accuracy every 5 steps, seeds
{', '.join(map(str, plan.control_seeds))}.

{control_md}

{control_verdict}

## 4. Frequency response of the score stream

{freq_md}

![frequency response]({freq_png})

The post-RoPE shear is an exact linear filter of the key stream, so the measured gain follows
the closed form (r = {post:.4f}; the paper reports r ~ 0.9966); what deviates is estimation
(window, the zero boundary at j = 0). The same keys sheared before RoPE do not follow it: the
rotation between neighbouring positions (the Coriolis term of the placement corollary) changes
the filter, which is why the shear must come after RoPE.

## 5. A deep model: steps until induction emerges

The paper's headline training result is on a 91.3M-parameter model: induction (0.9 held-out
accuracy) in 3/3 seeds at gamma 0.8 after 717 steps, in 2/3 seeds at gamma 0 after 2700.

{deep_md}

"-": the seed did not reach 0.9 within the budget.

## Where this disagrees with the paper

{disagreements(variants, summary, best, freq)}
"""


def write_readme_block(summary: dict, best: float, freq: dict) -> None:
    lines = ["| d_k | T | measured onset (accuracy 0.5) | closed-form gamma_c | onset / gamma_c |",
             "|---|---|---|---|---|"]
    for (d_k, T), s in summary.items():
        onset = "none" if s["onset"] is None else f"{s['onset']:.2f}"
        ratio = "-" if s["onset"] is None else f"{s['onset'] / s['gamma_c']:.2f}"
        lines.append(f"| {d_k} | {T} | {onset} | {s['gamma_c']:.3f} | {ratio} |")
    post, pre = freq["post-RoPE (as built)"], freq["pre-RoPE (wrong placement)"]
    block = ("\n".join(lines) + f"\n\nNegative control (ih-offset): best gamma "
             f"{best:g}{' (as the paper)' if best == 0 else ' (the paper: 0)'}. Score-stream gain "
             f"against H(omega): r = {post['r']:.4f}, max relative error "
             f"{post['max_rel_err']:.3f} post-RoPE; {pre['max_rel_err']:.3f} with the shear "
             f"placed before RoPE.\n")
    write_block("reproduce", block)


def disagreements(variants: dict, summary: dict, best: float, freq: dict) -> str:
    """Where this project's runs and the paper part ways, each computed from the runs above."""
    out = []
    sht = variants.get("ih-sht")
    if sht is not None:
        two = [r["steps_to_90"] for r in sht[("baseline", 2)]]
        key = [r["steps_to_90"] for r in sht[("key-only", 1)]]
        base1 = max(r["accuracy"] for r in sht[("baseline", 1)])
        if all(t is not None for t in two + key) and statistics.mean(two) <= statistics.mean(key):
            out.append(f"- Speed of learning: the paper's 717 vs 2700 steps (gamma 0.8 vs 0, one "
                       f"91M model) is not reproduced. Here a 1-layer gamma = 0 model never "
                       f"learns ih-sht (best seed {base1:.3f}), as SHT predicts, while a 2-layer "
                       f"baseline learns it faster ({statistics.mean(two):.0f} steps to 0.9) "
                       f"than 1-layer key-only ({statistics.mean(key):.0f}): PSA buys induction "
                       f"with one layer instead of two, it does not beat two.")
    ratios = [s["onset"] / s["gamma_c"] for s in summary.values() if s["onset"] is not None]
    if ratios:
        out.append(f"- Critical coupling: the measured onset is {min(ratios):.2f} to "
                   f"{max(ratios):.2f} x the closed-form gamma_c. The paper also finds trained "
                   f"onsets below gamma_c; here they are well below it, so gamma_c is at best a "
                   f"loose upper bound for this trainer.")
    L = theory.log_context(512)
    big = np.sqrt(2 * L / np.sqrt(8 * L))
    small = np.sqrt(1 / (2 * theory.C ** 2 * np.sqrt(2 * L)))
    out.append(f"- The closed form itself: its two branches do not meet at the crossover "
               f"d_k* = 8L (T = 512: {big:.3f} from the large-d_k branch, {small:.3f} from the "
               f"small one); implemented as stated.")
    if best != 0:
        out.append(f"- Negative control: the best gamma on ih-offset is {best:g}, not 0 as in "
                   f"the paper; every gamma solves the task, the differences are steps of "
                   f"learning speed (table above).")
    post = freq["post-RoPE (as built)"]["r"]
    out.append(f"- Frequency response: r = {post:.4f} here against the paper's 0.9966; the "
               f"post-RoPE shear is an exact linear filter of the key stream, so what a "
               f"measurement can miss is estimation error, not the mechanism.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
