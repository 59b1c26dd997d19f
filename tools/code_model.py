"""The shipped code-completion model and the real-data variant table, on the source of the
Python standard library of the interpreter that runs psa-edge (no download).

    .venv/bin/python tools/code_model.py train [--device cuda]   # models/psa-code.pt + twin
    .venv/bin/python tools/code_model.py variants [--device cuda] [--jobs 2]
    .venv/bin/python tools/code_model.py report    # docs/results/code-model.md and overview.md

`train`: a BPE on the corpus's training split (out/code/), then `psa-edge train --text` of the
key-only model and of its twin (`--variant baseline`). `variants`: 1- and 2-layer baseline,
key-only and symmetric models, cached in docs/results/real-variants/. `report`: the pair exported
(ONNX, XNNPACK; fp32, int8-dynamic, int4 in groups of 32 and of 128), quant-checked, and its decode
timed over `--rounds` rounds with each PSA build and its twin's taking turns; both tables written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import OUT, REPO, export_once, machine, mean_std, psa_edge, psa_edge_json, \
    write_block, write_doc

STDLIB = sysconfig.get_paths()["stdlib"]
CODE = OUT / "code"
# 1,536 tokens: psa-4m (3 layers, tied) stored in float16 is then a 4.85 MB file, under the
# repository's 5 MB limit for a file (with 2,048 tokens: 5.03 MB).
VOCAB = {"shipped": 1536, "variants": 2048}
MODELS = {"psa": REPO / "models" / "psa-code.pt", "twin": REPO / "models" / "psa-code-twin.pt"}
SHIPPED = ["--preset", "psa-4m", "--tie-embeddings", "--seq-len", "256", "--batch-size", "16",
           "--lr", "2e-3", "--eval-every", "250", "--eval-samples", "128", "--weights-dtype",
           "float16"]
VARIANT_RUNS = REPO / "docs" / "results" / "real-variants"
VARIANTS = ["--preset", "psa-1m", "--seq-len", "256", "--batch-size", "16", "--lr", "3e-3",
            "--eval-every", "250", "--eval-samples", "128"]
ROWS = [(v, layers) for layers in (1, 2) for v in ("baseline", "key-only", "symmetric")]
SEEDS = (0, 1)
PRECISIONS = (None, "int8-dynamic", "int4", "int4-g128")  # None: fp32
DECODE_BENCH = ("-p", "128", "-n", "128", "-r", "3")  # tg128: the decode column


def tokenizer(vocab: int) -> Path:
    """The corpus's BPE of `vocab` tokens, trained once and shared by the models that use it."""
    path = CODE / f"tokenizer-{vocab}.json"
    if not path.exists():
        from psa_edge.tasks.text import read_corpus
        from psa_edge.tokenizer import train_bpe

        CODE.mkdir(parents=True, exist_ok=True)
        path.write_text(train_bpe(read_corpus([STDLIB]).split("train"), vocab).json)
    return path


def train_command(variant: str, extra: list, out: Path, device: str, vocab: int) -> list:
    # Paths relative to the repository (the CLI runs there): the recorded command is the same
    # in any checkout.
    return ["train", "--text", STDLIB, "--tokenizer", tokenizer(vocab).relative_to(REPO),
            "--variant", variant, *extra, "--device", device, "-o", out.relative_to(REPO)]


def train(args) -> None:
    runs = [train_command(v, SHIPPED + ["--steps", args.steps], MODELS[m], args.device,
                          VOCAB["shipped"]) for m, v in (("psa", "key-only"), ("twin", "baseline"))]
    with ThreadPoolExecutor(2) as pool:
        for result in pool.map(lambda a: psa_edge(*a, env={"OMP_NUM_THREADS": "1"}), runs):
            print(result.stdout.strip(), flush=True)


def variants(args) -> None:
    VARIANT_RUNS.mkdir(parents=True, exist_ok=True)
    jobs = [(v, layers, seed) for v, layers in ROWS for seed in SEEDS
            if not (VARIANT_RUNS / f"{v}_{layers}L_seed{seed}.json").exists()]

    def run(job):
        variant, layers, seed = job
        out = CODE / "variants" / f"{variant}_{layers}L_seed{seed}.pt"
        out.parent.mkdir(parents=True, exist_ok=True)
        psa_edge(*train_command(variant, VARIANTS + ["--layers", layers, "--seed", seed,
                                                     "--steps", args.steps], out, args.device,
                                 VOCAB["variants"]), env={"OMP_NUM_THREADS": "1"})
        meta = json.loads(Path(f"{out}.json").read_text())["metadata"]
        row = {"spec": meta["train"], "summary": meta["summary"], "command": meta["command"]}
        (VARIANT_RUNS / out.with_suffix(".json").name).write_text(json.dumps(row, indent=1))
        return job

    with ThreadPoolExecutor(args.jobs) as pool:
        for done in pool.map(run, jobs):
            print("done", *done, flush=True)


def variant_table() -> tuple[str, str]:
    runs = {}
    for path in sorted(VARIANT_RUNS.glob("*.json")):
        row = json.loads(path.read_text())
        runs.setdefault((row["spec"]["variant"], row["spec"]["layers"]), []).append(row)
    spec = next(iter(runs.values()))[0]["spec"]
    lines = ["| model | held-out perplexity | next-token accuracy | at copy positions | "
             "elsewhere |", "|---|---|---|---|---|"]
    for variant, layers in ROWS:
        finals = [r["summary"]["final"] for r in runs[(variant, layers)]]
        lines.append(f"| {variant}, {layers} layer{'s' if layers > 1 else ''} | "
                     f"{mean_std([f['val_perplexity'] for f in finals])} | "
                     f"{mean_std([f['accuracy'] for f in finals])} | "
                     f"{mean_std([f['copy_accuracy'] for f in finals])} | "
                     f"{mean_std([f['other_accuracy'] for f in finals])} |")
    device = next(iter(runs.values()))[0]["summary"]["device"]
    budget = (f"preset `{spec['preset']}` (hidden 128, 4 heads) at 1 and 2 layers, BPE "
              f"vocabulary {VOCAB['variants']}, {spec['steps']} steps of {spec['batch_size']} x "
              f"{spec['task_params']['seq_len']} tokens, lr {spec['lr']}, on {device}; mean ± "
              f"std over seeds {', '.join(map(str, SEEDS))}")
    return "\n".join(lines), budget


def report(args) -> None:
    builds, summaries = {}, {}
    CODE.mkdir(parents=True, exist_ok=True)  # a fresh clone that did not train has none
    for name, checkpoint in ((n, c) for n, c in MODELS.items() if c.exists()):
        summaries[name] = json.loads(Path(f"{checkpoint}.json").read_text())["metadata"]
        for target, quant in ((t, q) for t in ("onnx", "xnnpack") for q in PRECISIONS):
            folder = export_once(checkpoint, CODE / f"{name}-{target}-{quant or 'fp32'}",
                                 target, quant, max_seq_len=256)
            check = psa_edge_json("quant-check", checkpoint, folder, "--samples", args.samples,
                                  check=False) if quant else None
            builds[name, target, quant or "fp32"] = (folder, check)
            print(name, target, quant, flush=True)
    # The PSA model and its twin take turns (same backend and precision back to back) in every
    # round: this VM's speed moves by more than their difference from one minute to the next.
    speeds = {key: [] for key in builds}
    for round_ in range(args.rounds):
        for key in sorted(builds, key=lambda k: (k[1], k[2], k[0])):
            speeds[key].append(psa_edge_json("bench", builds[key][0], *DECODE_BENCH,
                                             "--threads", 1)["results"][0])
        print("round", round_ + 1, "of", args.rounds, flush=True)
    rows = [(*key, check, speeds[key]) for key, (_, check) in builds.items()]
    write_report(rows, summaries, args)


def write_report(rows, summaries, args) -> None:
    lines = ["| model | backend | precision | size (MB) | decode t/s (1 thread, median of "
             f"{args.rounds}) | perplexity float / quantized | increase | top-1 agreement | "
             "quant-check |", "|---|---|---|---|---|---|---|---|---|"]
    decode = {(n, t, q): statistics.median(s["tg128"]["tokens_per_second"] for s in speeds)
              for n, t, q, _, speeds in rows}
    for name, target, precision, check, speeds in rows:
        m = check["metrics"] if check else None
        lines.append(
            f"| {'PSA (key-only 0.8)' if name == 'psa' else 'twin (gamma 0)'} | "
            f"{'ONNX Runtime' if target == 'onnx' else 'ExecuTorch XNNPACK'} | {precision} | "
            f"{speeds[0]['size_bytes'] / 1e6:.1f} | {decode[name, target, precision]:.0f} | "
            + (f"{m['target_perplexity_float']:.3f} / {m['target_perplexity_artifact']:.3f} | "
               f"{m['target_perplexity_ratio'] - 1:+.2%} | {m['top1_agreement']:.4f} | "
               f"{'PASS' if check['passed'] else 'FAIL'} |" if m else "| | | |"))
    lead = [decode["twin", t, q] / decode["psa", t, q] for n, t, q in decode if n == "psa"
            and ("twin", t, q) in decode]
    speed_note = (f"Decode: the default export form (explicit state), `psa-edge bench "
                  f"{' '.join(DECODE_BENCH)}`, the median of {args.rounds} rounds in which each "
                  f"PSA build and its twin's take turns. The twin decodes "
                  f"{min(lead):.2f}-{max(lead):.2f}x as fast: "
                  "at psa-4m's size the shear's few elementwise operators per layer are a "
                  "measurable part of a token, as docs/history/decode-profile.md measures them.\n"
                  if lead else "")
    finals = {k: s["summary"]["final"] for k, s in summaries.items()}
    stored = {k: psa_edge_json("eval", MODELS[k], "--samples", 128) for k in finals}
    quality = " ".join(  # the training's last evaluation ran on the float32 weights
        f"{'PSA' if k == 'psa' else 'Twin'}: held-out perplexity {f['val_perplexity']:.3f} "
        f"({stored[k]['val_perplexity']:.3f} as stored in float16), next-token accuracy "
        f"{f['accuracy']:.3f} ({f['copy_accuracy']:.3f} at copy positions, "
        f"{f['other_accuracy']:.3f} elsewhere)." for k, f in finals.items())
    train = summaries["psa"]
    block = (f"`models/psa-code.pt`: trained by `{train['command']}` and "
             f"`models/psa-code-twin.pt` the same with `--variant baseline`, side by side, on "
             f"{train['summary']['device']} in {train['summary']['wall_seconds'] / 60:.0f} min. "
             f"{quality}\n\n"
             + "\n".join(lines) + "\n\n" + speed_note)
    variants, budget = variant_table()
    write_block("code-model", block)
    write_block("real-variants", f"On one corpus and one tokenizer ({budget}):\n\n{variants}\n")
    write_doc("code-model.md", f"""# The code-completion model

Made by `.venv/bin/python tools/code_model.py train/variants/report` on {machine()} (the
report; the training device is named with each result). Corpus: the standard library's source
under `{STDLIB}` (`psa-edge train --text` walks it; installed packages, `site-packages`, are not
part of it), split into training and validation by a hash of each file. Copy positions are
those whose last two tokens repeat a pair seen earlier in the window: where an induction head
can copy what followed.

{block}
## Real-data variant table

{budget}.

{variants}
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["train", "variants", "report"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, help="default: 2500 (train), 300 (variants)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="report: decode timing rounds")
    args = parser.parse_args()
    args.steps = args.steps or {"train": 2500, "variants": 300}.get(args.part)
    {"train": train, "variants": variants, "report": report}[args.part](args)


if __name__ == "__main__":
    main()
