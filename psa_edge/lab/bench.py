"""`psa-edge bench` with the lab's additions, over the device runtime's loop
(`runtime.bench`, whose contract this keeps).

Contract: `run_bench(artifact, spec, vs=None, progress=None)` and `execute(bench, progress)`
return the runtime's report plus
- per result `flops_per_token`: multiply-adds x 2 of one decoded token at context
  depth + n / 2 (`flops_per_token`);
- for a form ExecuTorch's LLM runner loads (`GraphForm.llm_runner`: the runner form), its own
  TextLLMRunner on the same file (prompt of p tokens, n new): per result `executorch_runner`,
  its prefill / decode rates from its Stats; each repetition opens it afresh and warms it up;
  with `vs` it runs both files, taking turns run by run, and adds its prefill time and decode
  time per token ratios to the PSA/twin ratios. ExecuTorch's TextLLMRunner loads its program
  itself; after its warm-up, what that load made resident is collapsed as psa-edge's own loads
  are, so the two loops run on the same pages.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from psa_edge.backends import huge_pages
from psa_edge.contract import TOKENIZER, get_form
from psa_edge.io import artifact_folder, native_output_captured, read_artifact
from psa_edge.runtime import bench as device
from psa_edge.runtime.bench import Bench, BenchSpec, prepare_bench, ratio


def run_bench(artifact: Path, spec: BenchSpec, vs: Path | None = None, progress=None) -> dict:
    return execute(prepare_bench(artifact, spec, vs), progress)


def execute(bench: Bench, progress=None) -> dict:
    report = device.execute(bench, progress)
    spec, manifests = bench.spec, bench.manifests
    for result, manifest in zip(report["results"], manifests):
        result["flops_per_token"] = flops_per_token(manifest["config"],
                                                    spec.depth + spec.gen // 2)
    if get_form(manifests[0]["form"]).llm_runner:
        stats = executorch_runner_stats([r.artifact for r in bench.runners], manifests, spec)
        for result, own in zip(report["results"], stats):
            result["executorch_runner"] = own
        if bench.has_twin:
            per_token = [[r["decode_ms"] / r["generated_tokens"] for r in s["runs"]]
                         for s in stats]
            report["ratio_psa_over_twin"].update({
                "executorch_runner_prefill_time": ratio(
                    *[[r["prefill_ms"] for r in s["runs"]] for s in stats]),
                "executorch_runner_decode_time_per_token": ratio(*per_token)})
    return report


def flops_per_token(cfg: dict, context: int) -> dict:
    """Multiply-adds x 2 of one decoded token at a given context length: the linears, the
    attention scores and weighted sum over `context` positions, and the shear (3 d per sheared
    stream, d the stream's width). RMSNorm, RoPE and softmax are left out (O(d), tiny)."""
    h, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    dh, inter, vocab = d // h, cfg["intermediate_size"], cfg["vocab_size"]
    linear = d * (h * dh + 2 * hkv * dh) + h * dh * d + 3 * d * inter
    attention = 2 * h * dh * context
    shear = 3 * ((hkv * dh if cfg["gamma_k"] else 0) + (h * dh if cfg["gamma_q"] else 0))
    layers = cfg["num_hidden_layers"]
    total = layers * (2 * linear + 2 * attention + shear) + 2 * d * vocab
    return {"total": total, "shear": layers * shear, "context": context}


def executorch_runner_stats(artifacts: list[Path], manifests: list[dict], spec: BenchSpec
                            ) -> list[dict]:
    """ExecuTorch's own TextLLMRunner on each .pte: its Stats, per run, as times and rates.
    As psa-edge's own loop, every repetition opens each file afresh and warms it up (a short
    generation, not timed), and two files take turns run by run (A B, then B A)."""
    with native_output_captured():  # its tokenizer library logs natively on import
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

        from psa_edge.backends.executorch import load_llama_ops

        load_llama_ops()  # the runner form's kernels, in the runner's process

    from psa_edge.tokenizer import Tokenizer

    # Random ids read as text by the model's tokenizer (a byte-level BPE may encode that text
    # back into another count of tokens: the runner's Stats report what it fed).
    tokenizer = Tokenizer.from_file(artifact_folder(artifacts[0]) / TOKENIZER)
    prompt = tokenizer.decode(np.random.default_rng(1).integers(
        0, manifests[0]["config"]["vocab_size"], size=spec.prompt))
    collected = [[] for _ in artifacts]
    timed, warm_up = (GenerationConfig(echo=False, max_new_tokens=n, temperature=0.0,
                                       seq_len=spec.prompt + spec.gen)
                      for n in (spec.gen, min(spec.gen, 8)))
    ignore = lambda _: None  # noqa: E731
    with native_output_captured():  # the runner logs as it loads, prints text and its report
        for rep in range(spec.reps):
            order = list(range(len(artifacts)))[::1 if rep % 2 == 0 else -1]
            runners = None  # the previous repetition's programs are released first
            held = huge_pages.resident_now()
            runners = {i: TextLLMRunner(str(read_artifact(artifacts[i]).model_path),
                                        str(artifact_folder(artifacts[i]) / TOKENIZER))
                       for i in order}
            for i in order:  # the warm-up: after it each runner has loaded its program
                runners[i].generate(prompt, warm_up, token_callback=ignore,
                                    stats_callback=ignore)
            huge_pages.collapse_resident_memory(held)
            for i in order:
                runners[i].reset()
                runners[i].generate(prompt, timed, token_callback=ignore,
                                    stats_callback=collected[i].append)
    return [runner_summary(stats) for stats in collected]


def runner_summary(stats: list) -> dict:
    """TextLLMRunner Stats of the timed runs as per-run times and rates, and their mean."""
    runs = []
    for s in stats:
        prefill_ms = max(1, s.prompt_eval_end_ms - s.inference_start_ms)
        decode_ms = max(1, s.inference_end_ms - s.prompt_eval_end_ms)
        runs.append({"prompt_tokens": s.num_prompt_tokens,
                     "generated_tokens": s.num_generated_tokens,
                     "prefill_ms": prefill_ms, "decode_ms": decode_ms,
                     "prefill_tokens_per_second": 1e3 * s.num_prompt_tokens / prefill_ms,
                     "decode_tokens_per_second": 1e3 * s.num_generated_tokens / decode_ms})
    mean = lambda k: statistics.mean(r[k] for r in runs)  # noqa: E731
    spread = lambda k: statistics.stdev(r[k] for r in runs) if len(runs) > 1 else 0.0  # noqa
    return {"runs": runs, "prefill_tokens_per_second": mean("prefill_tokens_per_second"),
            "prefill_stddev": spread("prefill_tokens_per_second"),
            "decode_tokens_per_second": mean("decode_tokens_per_second"),
            "decode_stddev": spread("decode_tokens_per_second"),
            "note": "ExecuTorch Stats (ms timestamps): prefill = prompt_eval_end - "
                    "inference_start; decode = inference_end - prompt_eval_end over "
                    "num_generated_tokens, which the runner counts without the first token "
                    "(it comes out of the prefill)"}
