"""The `psa-edge` command line: thin typer commands over the library.

Contract: every `PsaEdgeError` and every usage error (an unknown option, a number out of its
range) becomes one line `error: ...` on stderr and exit code 2; a failed check exits 1; an
interrupt 130. Heavy imports (torch, matplotlib) happen inside the command that
needs them, so `psa-edge --help` stays instant.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from psa_edge import EXCLUSIVE_LOW, LENGTH_MAX, SEED_MAX, TRAIN_RANGES
from psa_edge.errors import EXIT_BAD_INPUT, ConfigError, PsaEdgeError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  rich_markup_mode=None, context_settings={"max_content_width": 100},
                  help="Train, check and ship small Phase Space Attention transformers.")

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "models" / "psa-default.pt"
# More threads than this only oversubscribes the cores; far more hangs thread pools.
THREADS_MAX = 4 * (os.cpu_count() or 1)


def number(low: float | None = None, high: float | None = None, *, above: float | None = None):
    """A typer callback refusing NaN/inf and values outside [low, high] (or not above `above`)."""
    def check(value):
        if value is None:
            return value
        if not math.isfinite(value):
            raise typer.BadParameter(f"{value} is not a finite number")
        if above is not None and not value > above:
            raise typer.BadParameter(f"{value} must be above {above:g}")
        if low is not None and value < low or high is not None and value > high:
            bounds = (f"is not in [{low:g}, {high:g}]" if None not in (low, high) else
                      f"must be >= {low:g}" if high is None else f"must be <= {high:g}")
            raise typer.BadParameter(f"{value} {bounds}")
        return value
    return check


def spec_range(name: str) -> dict:
    """typer.Option's bounds for a training option: the library's (`psa_edge.TRAIN_RANGES`),
    by which `train --resume` also checks what a training state recorded."""
    low, high, kind = TRAIN_RANGES[name]
    if kind is int:
        return {"min": low, "max": high}
    return {"callback": number(high=high, above=low) if name in EXCLUSIVE_LOW else
            number(low, high)}


def lab_module(name: str):
    """`psa_edge.lab.<name>`, or None where the lab is not installed (the device bundle);
    an import error inside the lab is raised, not taken for its absence."""
    try:
        return importlib.import_module(f"psa_edge.lab.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("psa_edge.lab", f"psa_edge.lab.{name}"):
            raise
        return None


def one_of(what: str, module: str, table: str):
    """A typer callback refusing a name that `module.table` does not hold, as the library would
    ("unknown preset ..."). The module is imported when the option is checked, not when the CLI
    starts: these tables are torch-free, so a misspelt name is refused before the command pays
    for torch, and a device bundle, which lacks the training modules, still starts."""
    def check(value):
        if value is None:
            return value
        names = tuple(getattr(importlib.import_module(module), table))
        if value not in names:
            raise typer.BadParameter(f"unknown {what} {value!r}; choose one of "
                                     f"{', '.join(names)}")
        return value
    return check


def input_file(what: str):
    """A typer callback refusing an input that is not a readable regular file (missing, a
    folder, a broken symlink or a loop, a FIFO), in the library's words (`io.not_a_file`), while
    the options are parsed: before the command imports torch."""
    def check(value):
        from psa_edge.io import not_a_file

        if value is not None and (problem := not_a_file(value)) is not None:
            raise typer.BadParameter(f"{what} {value} {problem}")
        return value
    return check


def library_check(module: str, function: str, **options):
    """A typer callback running the library's own check `module.function(value, **options)` (on
    each value of a repeatable option) while the options are parsed, before the command imports
    torch; the check's refusal, in its words, is the usage error. The module is imported when
    the option is checked. The library runs the same check again for callers of its API."""
    def check(value):
        if value is None:
            return value
        run = getattr(importlib.import_module(module), function)
        try:
            for item in value if isinstance(value, list) else [value]:
                run(item, **options)
        except PsaEdgeError as exc:
            raise typer.BadParameter(str(exc))
        return value
    return check


# Outputs that cannot be written: a missing or read-only parent, a folder where a file goes, a
# folder that is not one psa-edge wrote, of that kind (the library checks them again beside the
# inputs they must not overwrite, which needs every argument).
OUTPUT_FILE = library_check("psa_edge.io", "check_output")
OUTPUT_FOLDER = library_check("psa_edge.io", "check_output", directory=True)
HF_OUTPUT_FOLDER = library_check("psa_edge.io", "check_hf_output")


@app.command(short_help="Train a model; write checkpoint, metrics, curve.")
def train(
    output: Path = typer.Option(..., "-o", "--output", callback=OUTPUT_FILE,
                                help="Checkpoint to write (model.pt)."),
    task: str = typer.Option("ih-safari", callback=one_of("task", "psa_edge.tasks", "TASKS"),
                             help="ih-safari, ih-sht, ih-offset or mqar."),
    text: Optional[list[str]] = typer.Option(
        None, "--text", metavar="PATH",
        callback=library_check("psa_edge.tasks.text", "check_corpus_path"),
        help="Train a language model on these files, folders or globs (repeatable) instead of "
        "a task, with a byte-level BPE trained on them."),
    vocab_size: Optional[int] = typer.Option(None, **spec_range("vocab_size"),
                                             help="Text: BPE vocabulary (default: the "
                                             "preset's, at least 512)."),
    preset: str = typer.Option("tiny", callback=one_of("preset", "psa_edge.model.config",
                                                       "PRESETS"),
                               help="tiny, psa-0.5m, psa-1m, psa-4m, psa-30m or psa-92m."),
    variant: str = typer.Option("key-only", callback=one_of("variant", "psa_edge.model.config",
                                                            "VARIANTS"),
                                help="baseline, key-only, symmetric or query-only."),
    gamma: Optional[float] = typer.Option(None, **spec_range("gamma"),
                                          help="Shear strength (default 0.8; 0 for baseline)."),
    layers: Optional[int] = typer.Option(None, **spec_range("layers"),
                                         help="Number of layers (default: the preset's)."),
    tie_embeddings: bool = typer.Option(False, "--tie-embeddings",
                                        help="One matrix for the token embedding and lm_head."),
    steps: int = typer.Option(1000, **spec_range("steps"), help="Optimizer steps."),
    seed: int = typer.Option(0, **spec_range("seed"),
                             help="Seed of the weights and of every batch."),
    batch_size: int = typer.Option(32, **spec_range("batch_size"),
                                   help="Sequences per step (over all processes)."),
    lr: float = typer.Option(3e-3, **spec_range("lr"),
                             help="Peak learning rate (warm-up, then cosine decay)."),
    eval_every: int = typer.Option(100, **spec_range("eval_every"),
                                   help="Steps between held-out evaluations."),
    eval_samples: int = typer.Option(512, **spec_range("eval_samples"),
                                     help="Held-out sequences per evaluation."),
    seq_len: Optional[int] = typer.Option(None, min=2, max=LENGTH_MAX,
                                          help="Sequence length (default: the task's; "
                                          "256 for text)."),
    device: str = typer.Option("auto",
                               callback=library_check("psa_edge.train", "check_device"),
                               help="auto (a GPU when there is one), cpu, cuda or cuda:N."),
    compile_model: bool = typer.Option(False, "--compile", help="torch.compile the training "
                                       "forward."),
    nproc: int = typer.Option(1, min=1, max=THREADS_MAX,
                              help="Data-parallel processes (launches torchrun)."),
    init: Optional[Path] = typer.Option(None, callback=input_file("checkpoint"),
                                        help="Start from this checkpoint's weights and "
                                        "tokenizer (fine-tuning), with the shear given here."),
    resume: Optional[Path] = typer.Option(None, callback=input_file("training state"),
                                          help="Continue the run of this training state "
                                          "(<stem>.state.pt) with its own options."),
    state_every: int = typer.Option(0, **spec_range("state_every"),
                                    help="Write a resumable <stem>.state.pt every N "
                                    "steps (0: never)."),
    stop_at: Optional[float] = typer.Option(None, **spec_range("stop_at"),
                                            help="Stop once the held-out accuracy reaches "
                                            "this (e.g. 0.9 to measure steps to 0.9)."),
    tokenizer: Optional[Path] = typer.Option(None, callback=input_file("tokenizer"),
                                             help="Text: use this tokenizer.json instead of "
                                             "training one."),
    weights_dtype: str = typer.Option("float32",
                                      callback=one_of("weights dtype", "psa_edge.model.config",
                                                      "WEIGHT_DTYPES"),
                                      help="Storage precision of the checkpoint's "
                                      "weights: float32, float16 or bfloat16 (half the "
                                      "file; the model still computes in float32)."),
) -> None:
    """Train a model on an induction task or on text and write a checkpoint (with its
    tokenizer), metrics and a curve."""
    if nproc > 1:
        raise typer.Exit(launch_torchrun(nproc))
    from psa_edge.display import stage_bar
    from psa_edge.train.run import TEXT_STAGES, TrainSpec, prepare, run_training
    from psa_edge.train.trainer import resolve_device

    params = {"seq_len": seq_len} if seq_len else {}
    overrides = {"tie_word_embeddings": True} if tie_embeddings else {}
    spec = TrainSpec(task="text" if text else task, preset=preset, variant=variant,
                     gamma=gamma, layers=layers, steps=steps, seed=seed,
                     batch_size=batch_size, lr=lr, eval_every=eval_every,
                     eval_samples=eval_samples, task_params=params,
                     config_overrides=overrides, text=tuple(text or ()),
                     vocab_size=vocab_size, device=resolve_device(device),
                     compile=compile_model, state_every=state_every, stop_at=stop_at,
                     weights_dtype=weights_dtype)
    # Under torchrun every process prepares; the first one draws (as it draws the training's).
    with stage_bar("train", TEXT_STAGES, enabled=os.environ.get("RANK", "0") == "0") as started:
        plan = prepare(spec, output, init, resume, tokenizer, started)
    summary = run_training(plan, command=" ".join(["psa-edge", *sys.argv[1:]]))
    if summary is None:
        return
    final = summary["final"]
    typer.echo(f"wrote {output}: " + (
        f"held-out perplexity {final['val_perplexity']:.2f}, next-token accuracy "
        f"{final['accuracy']:.3f} ({final['copy_accuracy']:.3f} at copy positions, "
        f"{final['other_accuracy']:.3f} elsewhere)" if "copy_accuracy" in final else
        f"accuracy {summary['accuracy']:.3f}, steps to 0.9: "
        f"{summary['steps_to_90'] or 'not reached'}"))


def launch_torchrun(nproc: int) -> int:
    """This train command again under torchrun, in `nproc` processes; its exit code."""
    import subprocess

    argv, skip = [], False
    for arg in sys.argv[1:]:
        if skip or arg.startswith("--nproc="):
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        argv.append(arg)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", "-m", "psa_edge.cli", *argv]).returncode


@app.command(name="eval", short_help="Held-out accuracy of a checkpoint.")
def eval_cmd(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                      callback=input_file("checkpoint"), help="model.pt"),
    task: Optional[str] = typer.Option(None, callback=one_of("task", "psa_edge.tasks", "TASKS"),
                                       help="Task (default: the one it was trained on)."),
    samples: int = typer.Option(512, min=1, max=LENGTH_MAX, help="Held-out sequences."),
    seed: int = typer.Option(1234, min=0, max=SEED_MAX, help="Seed of the held-out sample."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Held-out accuracy of a checkpoint."""
    from psa_edge.display import progress_bar
    from psa_edge.train.run import eval_report, eval_target

    model, scored_task = eval_target(checkpoint, task)
    with progress_bar("eval", samples, enabled=not as_json) as advance:
        result = eval_report(model, scored_task, samples, seed, advance)
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    typer.echo(f"{result['task']}: accuracy {result['accuracy']:.4f} "
               f"(last position {result['last_accuracy']:.4f}, chance {result['chance']:.4f}, "
               f"{result['samples']} held-out samples)")


@app.command(short_help="Export and check an ONNX / ExecuTorch artifact.")
def export(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                      callback=input_file("checkpoint"), help="model.pt"),
    target: str = typer.Option("xnnpack", callback=one_of("target", "psa_edge.contract",
                                                          "BACKENDS"),
                               help="xnnpack, portable or onnx."),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          callback=OUTPUT_FOLDER,
                                          help="Artifact folder to write (default: beside the "
                                          "checkpoint, named after it, the target and form)."),
    max_seq_len: Optional[int] = typer.Option(None, min=2, max=LENGTH_MAX,
                                              help="Longest sequence the artifact takes "
                                              "(default: the model's max_position_embeddings)."),
    twin: bool = typer.Option(False, "--twin", help="Export the gamma = 0 twin instead."),
    form: str = typer.Option("explicit-state",
                             callback=one_of("form", "psa_edge.contract", "FORMS"),
                             help="explicit-state; runner (ExecuTorch LLM-runner form with an "
                             "in-program cache); fused (ONNX Runtime's fused attention over "
                             "static in-place caches); or raw-key (ONNX: a plain Llama's I/O "
                             "that optimum and onnxruntime-genai run; gamma_q = 0)."),
    quantize: Optional[str] = typer.Option(
        None, callback=one_of("quantization", "psa_edge.contract", "SCHEMES"),
        help="int8 (static activations, calibrated), int8-dynamic, int8-block (ONNX: 8-bit "
        "weights in blocks of 32), or int4 (4-bit weights: blocks of 32, HQQ scale-only on "
        "XNNPACK); default: fp32."),
    group_size: Optional[int] = typer.Option(None, help="Weights per scale of int4 and "
                                             "int8-block: a power of two (default 32); larger "
                                             "is a faster XNNPACK int4 prefill and a coarser "
                                             "grid."),
    calibration_samples: int = typer.Option(32, min=1, max=100_000,
                                            help="Task sequences for static calibration."),
    calibration_seed: int = typer.Option(0, min=0, max=SEED_MAX,
                                         help="Seed of the calibration draw."),
    keep_shear_fp32: bool = typer.Option(True, "--keep-shear-fp32/--quantize-shear",
                                         help="Keep the shear's Sub/Mul/Add in fp32 (default; "
                                         "measured in docs/results/quantization.md)."),
    text: Optional[list[str]] = typer.Option(
        None, "--text", metavar="PATH",
        callback=library_check("psa_edge.tasks.text", "check_corpus_path"),
        help="Held-out text (files, folders or globs; repeatable) that calibrates a quantized "
        "export and is its parity probe (default: the checkpoint's own task)."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Export a checkpoint to ONNX or ExecuTorch, check it against the float reference, and write
    the artifact folder (model, tokenizer, manifest) in one step (docs/reference/spec.md §8)."""
    from psa_edge.errors import ExportError

    if group_size is not None and not quantize:
        raise ExportError("--group-size needs --quantize int4 or int8-block")
    if text and not quantize:
        raise ExportError("--text is held-out data for --quantize; a float export needs none")
    from psa_edge.display import print_summary, stage_bar
    from psa_edge.export.pipeline import STAGES, ExportRequest, run_export
    from psa_edge.export.quantize import WEIGHT_BLOCK, QuantSpec

    group = WEIGHT_BLOCK if group_size is None else group_size
    quant = (QuantSpec(quantize, calibration_samples, calibration_seed, keep_shear_fp32, group)
             if quantize else None)
    request = ExportRequest(checkpoint, target, output, max_seq_len, twin, form, quant,
                            tuple(text or ()))
    with stage_bar("export", STAGES, enabled=not as_json) as started:
        manifest = run_export(request, started)
    if as_json:
        typer.echo(json.dumps(manifest, indent=2, sort_keys=True))
    else:
        print_summary(manifest, request.output or request.default_output())


@app.command(name="import-hf", short_help="A transformers Llama folder or a GGUF file to a "
             "checkpoint.")
def import_hf_cmd(
    folder: Path = typer.Argument(..., metavar="SOURCE",
                                  help="A LlamaForCausalLM save_pretrained folder "
                                  "(config.json, safetensors, tokenizer.json), or a llama.cpp "
                                  "GGUF file of a Llama model."),
    output: Path = typer.Option(..., "-o", "--output", callback=OUTPUT_FILE,
                                help="Checkpoint to write (model.pt)."),
    variant: Optional[str] = typer.Option(
        None, callback=one_of("variant", "psa_edge.model.config", "VARIANTS"),
        help="The shear to give it: baseline, key-only, symmetric or query-only (default: the "
        "folder's own; none for a Llama model)."),
    gamma: Optional[float] = typer.Option(None, callback=number(0, 100),
                                          help="Shear strength (default 0.8; 0 for baseline)."),
) -> None:
    """Read a Hugging Face Llama model (weights with safetensors, never unpickled) or a GGUF
    file (dequantized, its tokenizer rebuilt) into a psa-edge checkpoint with the chosen shear;
    fine-tune it with `train --init`."""
    from psa_edge.hf.convert import import_hf

    manifest = import_hf(folder, output, variant, gamma)
    typer.echo(f"wrote {output}: {manifest['config']['num_hidden_layers']} layers, variant "
               f"{manifest['variant']} (gamma_k {manifest['gamma_k']}, gamma_q "
               f"{manifest['gamma_q']})")


@app.command(name="export-hf", short_help="A checkpoint to a transformers folder.")
def export_hf_cmd(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT",
                                      callback=input_file("checkpoint"), help="model.pt"),
    output: Path = typer.Option(..., "-o", "--output", callback=HF_OUTPUT_FOLDER,
                                help="Folder to write (new, or one psa-edge wrote before)."),
) -> None:
    """Write the save_pretrained layout: config.json, model.safetensors, generation and tokenizer
    files; a sheared model carries its modeling code (load it with trust_remote_code=True)."""
    from psa_edge.hf.convert import export_hf

    export_hf(checkpoint, output)
    typer.echo(f"wrote {output}")


@app.command(short_help="What an artifact holds: I/O, ops, delegation.")
def inspect(
    artifact: Path = typer.Argument(..., metavar="ARTIFACT",
                                    help="Artifact folder (or the model file in it)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Manifest, I/O signature, op histogram and delegation summary of an artifact."""
    from psa_edge.display import print_inspection
    from psa_edge.export.inspect import inspect_artifact

    info = inspect_artifact(artifact)
    if as_json:
        typer.echo(json.dumps(info, indent=2, sort_keys=True))
    else:
        print_inspection(info)


@app.command(name="quant-check", short_help="Accuracy of a quantized artifact vs the float model.")
def quant_check_cmd(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT", callback=input_file("checkpoint"),
                                      help="model.pt the artifact was exported from"),
    artifact: Path = typer.Argument(..., metavar="ARTIFACT",
                                    help="Artifact folder, quantized or float."),
    task: Optional[str] = typer.Option(None, callback=one_of("task", "psa_edge.tasks", "TASKS"),
                                       help="Task (default: the checkpoint's own)."),
    text: Optional[list[str]] = typer.Option(
        None, "--text", metavar="PATH",
        callback=library_check("psa_edge.tasks.text", "check_corpus_path"),
        help="Check on this text instead (files, folders or globs; repeatable): its validation "
        "split, with the model's tokenizer."),
    seq_len: int = typer.Option(128, min=8, max=LENGTH_MAX,
                                help="Tokens per held-out sequence of --text."),
    samples: int = typer.Option(64, min=1, max=LENGTH_MAX, help="Held-out sequences."),
    seed: int = typer.Option(1234, min=0, max=SEED_MAX, help="Seed of the held-out sample."),
    max_acc_drop: Optional[float] = typer.Option(None, callback=number(0, 100),
                                                 help="Accuracy points the artifact may lose "
                                                 "(default 1)."),
    min_top1: Optional[float] = typer.Option(None, callback=number(0, 1),
                                             help="Minimum top-1 agreement with the "
                                             "reference (default 0.98; int4: 0.90)."),
    max_ppl_increase: Optional[float] = typer.Option(None, callback=number(0),
                                                     help="Language models: largest relative "
                                                     "increase of the validation perplexity "
                                                     "(default 0.05; int4: 0.10)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Accuracy of an (int8 / int4) artifact against the float reference; exit 1 past a
    threshold (the defaults depend on the artifact's scheme)."""
    from psa_edge.checks import quant_check
    from psa_edge.display import progress_bar, quant_check_table

    plan = quant_check.prepare(checkpoint, artifact, task, samples, seed, tuple(text or ()),
                               seq_len)
    with progress_bar("quant-check", samples, enabled=not as_json) as advance:
        limits = quant_check.Thresholds.of(plan.scheme, max_acc_drop=max_acc_drop,
                                           min_top1=min_top1, max_ppl_increase=max_ppl_increase)
        result = quant_check.run(plan, limits, advance)
    if as_json:
        typer.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        quant_check_table(result)
    for failure in result["failures"]:
        typer.echo(f"FAIL: {failure}", err=True)
    if result["failures"]:
        raise typer.Exit(1)


@app.command(short_help="Generate tokens, plainly or speculatively.")
def generate(
    artifact: Path = typer.Argument(..., metavar="ARTIFACT",
                                    help="Artifact folder (any form), or a model.pt "
                                    "(its float reference)."),
    prompt: Optional[str] = typer.Option(None, help="Prompt text (the model's own tokenizer)."),
    prompt_file: Optional[Path] = typer.Option(None, help="Prompt text from a file."),
    prompt_ids: Optional[str] = typer.Option(None, help="Prompt as comma-separated token ids."),
    chat: Optional[str] = typer.Option(None, metavar="TEXT",
                                       help="A user message, rendered by the model's chat "
                                       "template (generation stops at its end of turn)."),
    chat_file: Optional[Path] = typer.Option(None, metavar="PATH",
                                             help="A conversation: a JSON list of {\"role\", "
                                             "\"content\"}, rendered by the chat template."),
    max_new_tokens: int = typer.Option(32, "-n", "--max-new-tokens", min=0, max=LENGTH_MAX,
                                       help="Tokens to generate."),
    temperature: float = typer.Option(0.0, callback=number(0, 100), help="0 is greedy."),
    top_k: Optional[int] = typer.Option(None, min=1, help="Sample from the k most likely tokens."),
    top_p: Optional[float] = typer.Option(None, callback=number(high=1, above=0),
                                          help="Sample from the smallest set of tokens "
                                          "whose probability reaches p."),
    seed: int = typer.Option(0, min=0, max=SEED_MAX, help="Seed of the sampler."),
    stop: Optional[list[str]] = typer.Option(None, metavar="TEXT",
                                             help="Stop once the text holds this string "
                                             "(repeatable); the end-of-text token always "
                                             "stops."),
    stream: bool = typer.Option(False, "--stream", help="Print tokens as they come."),
    draft: Optional[Path] = typer.Option(None, help="Draft artifact for speculative decoding."),
    draft_len: int = typer.Option(4, min=1, max=64,
                                  help="Tokens the draft proposes per target call."),
    prompt_lookup: bool = typer.Option(False, "--prompt-lookup",
                                       help="Draft-free speculative decoding by prompt lookup."),
    threads: Optional[int] = typer.Option(None, min=1, max=THREADS_MAX,
                                          help="Backend threads (ONNX Runtime intra-op, "
                                          "ExecuTorch's threadpool)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Generate tokens with an artifact; optionally speculative (--draft or --prompt-lookup)."""
    from psa_edge.checks.reference import open_any
    from psa_edge.runtime.run import Prompt, run_generate

    run_generate(open_any(artifact, threads), str(artifact),
                 Prompt(prompt, prompt_file, prompt_ids, chat, chat_file), max_new_tokens,
                 temperature, top_k, top_p, seed, stop, stream, draft, draft_len,
                 prompt_lookup, threads, as_json)


@app.command(short_help="Check cache parity, reuse, rollback, speculation.")
def verify(
    artifact: Path = typer.Argument(..., metavar="ARTIFACT", help="Artifact folder (any form)."),
    reference: Optional[Path] = typer.Option(None, help="Float reference model.pt (default: "
                                             "the checkpoint the manifest names)."),
    twin: Optional[Path] = typer.Option(None, help="The gamma = 0 twin artifact, for the "
                                        "cache table (default: the eager twin)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """KV-cache parity, prefix reuse, rollback and speculative decoding against the float
    reference (docs/reference/spec.md §3, §5); exit 1 unless every check passes."""
    from psa_edge.checks.verify import STAGES
    from psa_edge.checks.verify import verify as run_verify
    from psa_edge.display import stage_bar, verify_table

    with stage_bar("verify", STAGES, enabled=not as_json) as started:
        report = run_verify(artifact, reference, twin, started=started)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        verify_table(report)
    if not report["passed"]:
        raise typer.Exit(1)


@app.command(short_help="Prefill and decode tokens/s, PSA vs its twin.")
def bench(
    artifact: Path = typer.Argument(..., metavar="ARTIFACT", help="Artifact folder (any form)."),
    vs: Optional[Path] = typer.Option(
        None, "--vs", help="The gamma = 0 twin (or the model in another form of the same "
        "target): run interleaved, both opened afresh every repetition; PSA/twin ratios with "
        "their 95% interval."),
    prompt: int = typer.Option(128, "-p", min=1, max=LENGTH_MAX,
                               help="Prefill test: tokens in one call."),
    gen: int = typer.Option(128, "-n", min=1, max=LENGTH_MAX,
                            help="Decode test: tokens, one call each."),
    reps: int = typer.Option(5, "-r", min=1, max=10_000,
                             help="Timed repetitions after one warm-up."),
    depth: int = typer.Option(0, "--depth", min=0, max=LENGTH_MAX,
                              help="Context tokens before each test."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, max=THREADS_MAX,
                                          help="Backend threads."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of tokens/s."),
    profile: bool = typer.Option(False, "--profile", help="ONNX Runtime: where the time of a "
                                 "prefill (-p tokens, -r times) and of a decoded token (-n "
                                 "after it) goes, per operator."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    markdown: bool = typer.Option(False, "--markdown", help="Print a markdown table."),
) -> None:
    """Prefill and decode tokens/s like llama-bench; with --vs, PSA against its twin."""
    from psa_edge.display import bench_tables, progress_bar
    from psa_edge.io import check_output, refuse_overlap
    from psa_edge.runtime.bench import BenchSpec, dumps, prepare_bench

    # The lab's additions (FLOPs, ExecuTorch's own runner, --profile) where it is installed;
    # the device bundle carries the runtime's loop only.
    execute = (lab_module("bench") or importlib.import_module("psa_edge.runtime.bench")).execute
    if profile:
        from psa_edge.display import profile_table

        if lab_module("profile") is None:
            raise ConfigError("--profile is psa-edge's measurement lab, which this device "
                              "bundle does not carry; profile on the machine that exported")
        profile_tokens = lab_module("profile").profile_tokens

        report = profile_tokens(artifact, BenchSpec(prompt, gen, reps, 0, threads))
        typer.echo(dumps(report)) if as_json else profile_table(report)
        return

    if plot is not None:
        check_output(plot)
        refuse_overlap([plot], [artifact, vs])
    prepared = prepare_bench(artifact, BenchSpec(prompt, gen, reps, depth, threads), vs)
    with progress_bar("bench", reps, enabled=not (as_json or markdown)) as advance:
        report = execute(prepared, progress=advance)
    if as_json:
        typer.echo(dumps(report))
    else:
        bench_tables(report, markdown)
    if plot is not None:
        from psa_edge.display import bench_plot

        bench_plot([report], plot)


@app.command(short_help="Write a folder to copy to a Pi or a phone.")
def bundle(
    artifacts: list[Path] = typer.Argument(..., metavar="ARTIFACTS",
                                           help="Artifact folders to bundle."),
    output: Path = typer.Option(..., "-o", "--output", help="Folder to write (new or empty)."),
) -> None:
    """Write a self-contained folder to copy to a device: artifacts, the torch-free runtime,
    requirements and the commands for a Raspberry Pi and an Android phone."""
    from psa_edge.runtime.bundle import write_bundle

    record = write_bundle(artifacts, output)
    typer.echo(f"wrote {output}: {len(record['artifacts'])} artifact(s), "
               f"{len(record['files'])} files; see {output}/README.md")


@app.command(short_help="Check the paper's operator claims numerically.")
def certify(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Executable certificates of the paper's operator-level claims; exit 1 if one fails."""
    from rich.table import Table

    from psa_edge.certify import run_all
    from psa_edge.display import make_console

    results = [c.to_dict() for c in run_all()]
    if as_json:
        typer.echo(json.dumps(results, indent=2))
    else:
        table = Table("certificate", "claim", "residual", "tolerance", "result")
        for c in results:
            table.add_row(c["name"], c["claim"], f"{c['residual']:.2e}", f"{c['tolerance']:.0e}",
                          "[green]PASS[/]" if c["passed"] else "[red]FAIL[/]")
        make_console().print(table)
    if not all(c["passed"] for c in results):
        raise typer.Exit(1)


@app.command(short_help="Walk the pipeline on the shipped model.")
def demo(
    checkpoint: Path = typer.Option(DEFAULT_MODEL, help="Checkpoint to walk through."),
) -> None:
    """Walk the whole pipeline on the shipped default model (in a temporary folder); exit 1 if
    one of its checks (quant-check, verify, speculative equality) fails."""
    from psa_edge.demo import run_demo

    failed = run_demo(checkpoint)
    if failed:
        typer.echo(f"demo: {', '.join(failed)} failed", err=True)
        raise typer.Exit(1)


def terminate(signum, frame) -> None:
    # An exception, not the default exit: every atomic writer's cleanup runs on its way out.
    raise SystemExit(128 + signum)


def main() -> None:
    import signal

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, terminate)
    try:  # typer vendors click from 0.22 on
        from typer._click import exceptions as click
    except ImportError:  # pragma: no cover
        from click import exceptions as click
    exits = (typer.Exit, getattr(click, "Exit", typer.Exit))
    aborts = (typer.Abort, getattr(click, "Abort", typer.Abort), KeyboardInterrupt)
    try:
        # Without standalone mode click returns typer.Exit's code instead of raising it.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except exits as exc:  # --help, typer.Exit(code)
        sys.exit(exc.exit_code)
    except getattr(click, "NoArgsIsHelpError", ()) as exc:
        typer.echo(exc.ctx.get_help())
        sys.exit(0)
    except click.ClickException as exc:  # a usage error: one line, as every bad input
        command = exc.ctx.command_path if getattr(exc, "ctx", None) else "psa-edge"
        typer.echo(f"error: {exc.format_message()} (see {command} --help)", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except aborts:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except PsaEdgeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except MemoryError:
        typer.echo("error: out of memory", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except OSError as exc:  # the machine, not the input: a full disk, a permission, a device
        where = f" ({exc.filename})" if exc.filename else ""
        typer.echo(f"error: {exc.strerror or exc}{where}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except ModuleNotFoundError as exc:  # a device bundle carries the runtime commands only
        if not (exc.name or "").startswith(("psa_edge", "torch")):
            raise
        typer.echo(f"error: this command needs {exc.name}, which this installation (a device "
                   f"bundle?) does not have", err=True)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
