"""`psa-edge quant-check`: does a quantized artifact still do the job? (docs/reference/spec.md §6)

Modelled on llama.cpp's KL-divergence check. Contract: `prepare(checkpoint, artifact, ...)`
- refuses an artifact whose manifest does not match it, or that was not exported from this
  checkpoint (source sha256), a task whose vocabulary is not the model's, and a sample count
  below 1 (`PsaEdgeError`: exit 2); the held-out data is the checkpoint's own task, another
  named task, or any text (`text`: a corpus as train takes it, the validation split, so any
  language model is checked on text);
then `run(plan, thresholds)`
- runs the float reference (eager fp32, full sequence; the gamma = 0 twin when the artifact is
  a twin) and the artifact on the same held-out sequences of the task, the artifact token by
  token through its incremental interface, as a device would;
- reports task accuracy (float, artifact, delta in points), top-1 agreement of the next-token
  argmax over every position, KL(float || artifact) per token (mean, p99, max), the RMS of the
  probability difference on the reference's top token, the max abs logit error, and the
  perplexity of the task's targets (scored positions) with its ratio;
- `failures` names every threshold crossed (accuracy drop in points, minimum top-1 agreement,
  and for a language model the relative increase of its validation perplexity), by default
  those of the artifact's scheme (`Thresholds.of`).
For a language model (a text task) the task accuracy is next-token accuracy and the perplexity
is the validation perplexity over every position of the held-out windows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from psa_edge.checks.reference import Reference, feed_chunks
from psa_edge.errors import ArtifactError, TaskError
from psa_edge.io import read_artifact, sha256_file
from psa_edge.tasks import EVAL_SEED, IGNORE, scored_task


@dataclass(frozen=True)
class Thresholds:
    max_acc_drop: float = 1.0       # accuracy points the artifact may lose
    min_top1: float = 0.98          # top-1 agreement with the float reference
    max_ppl_increase: float = 0.05  # language models: relative increase of the perplexity

    @classmethod
    def of(cls, scheme: str, **given) -> "Thresholds":
        """The defaults of a quantization scheme, with the `given` ones (not None) instead."""
        base = SCHEME_THRESHOLDS.get(scheme, cls())
        return dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})


# 4-bit weights move near-tied argmaxes far more often than int8 (llama.cpp's Q4_0 keeps about
# 90% of the top tokens on Llama models): an int4 build is judged by the task and the perplexity
# a user feels, with a looser top-1 floor (measured: docs/results/quantization.md).
SCHEME_THRESHOLDS = {"int4": Thresholds(max_acc_drop=1.0, min_top1=0.90, max_ppl_increase=0.10)}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def compare(reference: np.ndarray, candidate: np.ndarray, targets: np.ndarray, task,
            inputs: np.ndarray) -> dict:
    """The metrics of the check from logits `[n, T, V]` of both, the task's targets and the
    inputs (a text task scores copy positions from them)."""
    ref_pred, cand_pred = reference.argmax(-1), candidate.argmax(-1)
    log_p, log_q = log_softmax(reference.astype(np.float64)), log_softmax(
        candidate.astype(np.float64))
    p = np.exp(log_p)
    kl = (p * (log_p - log_q)).sum(-1).ravel()
    top = ref_pred[..., None]
    dp = np.take_along_axis(np.exp(log_q), top, -1) - np.take_along_axis(p, top, -1)
    scored = targets != IGNORE
    safe = np.where(scored, targets, 0)[..., None]
    nll_ref = -np.take_along_axis(log_p, safe, -1)[..., 0][scored].mean()
    nll_cand = -np.take_along_axis(log_q, safe, -1)[..., 0][scored].mean()
    acc_ref = task.score(ref_pred, targets, inputs)["accuracy"]
    acc_cand = task.score(cand_pred, targets, inputs)["accuracy"]
    return {
        "accuracy_float": acc_ref, "accuracy_artifact": acc_cand,
        "accuracy_delta_points": 100 * (acc_cand - acc_ref),
        "top1_agreement": float((ref_pred == cand_pred).mean()),
        "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()), "rms_dp_top": float(np.sqrt((dp ** 2).mean())),
        "max_abs_logit_error": float(np.abs(reference - candidate).max()),
        "target_perplexity_float": float(np.exp(nll_ref)),
        "target_perplexity_artifact": float(np.exp(nll_cand)),
        "target_perplexity_ratio": float(np.exp(nll_cand - nll_ref)),
        "positions": int(ref_pred.size), "scored_positions": int(scored.sum()),
    }


def failures(metrics: dict, limits: Thresholds, language_model: bool = False) -> list[str]:
    out = []
    increase = metrics["target_perplexity_ratio"] - 1
    if language_model and increase > limits.max_ppl_increase:
        out.append(f"perplexity increase {increase:.2%} exceeds --max-ppl-increase "
                   f"{limits.max_ppl_increase:g}")
    drop = -metrics["accuracy_delta_points"]
    if drop > limits.max_acc_drop:
        out.append(f"accuracy drop {drop:.2f} points exceeds --max-acc-drop "
                   f"{limits.max_acc_drop:g}")
    if metrics["top1_agreement"] < limits.min_top1:
        out.append(f"top-1 agreement {metrics['top1_agreement']:.4f} is below --min-top1 "
                   f"{limits.min_top1:g}")
    return out


def check_source(checkpoint: Path, artifact: Path, manifest: dict) -> None:
    source = manifest.get("source_checkpoint") or {}
    if source.get("sha256") != sha256_file(checkpoint):
        raise ArtifactError(f"{artifact.name} was not exported from {checkpoint} (its manifest "
                            f"names a checkpoint with sha256 {str(source.get('sha256'))[:12]}...)")


@dataclass
class Plan:
    """A validated check: the reference model, the held-out data and the artifact's decoder."""
    checkpoint: Path
    artifact: Path
    manifest: dict
    reference: Reference
    task: object
    inputs: np.ndarray
    targets: np.ndarray
    seed: int

    @property
    def scheme(self) -> str:
        """The artifact's quantization scheme ("fp32" for a float build)."""
        return (self.manifest.get("quantization") or {}).get("scheme", "fp32")


def prepare(checkpoint: Path, artifact: Path, task_name: str | None = None, samples: int = 64,
            seed: int = EVAL_SEED, text: tuple[str, ...] = (), seq_len: int = 128) -> Plan:
    """Every check of the input, before any long work (`PsaEdgeError` on bad input). With
    `text`, the held-out data is that corpus's validation split in windows of `seq_len`."""
    from psa_edge.tasks.text import TextTask, read_corpus

    checkpoint, artifact = Path(checkpoint), Path(artifact)
    if samples < 1:
        raise TaskError(f"--samples must be at least 1, got {samples}")
    if text and task_name:
        raise TaskError("pass --task or --text, not both")
    manifest = read_artifact(artifact).manifest
    check_source(checkpoint, artifact, manifest)
    reference = Reference.of_artifact(manifest, checkpoint)
    if text:
        task = TextTask(read_corpus(text), reference.model.tokenizer,
                        min(seq_len, manifest["max_seq_len"]))
    else:
        task = scored_task((manifest.get("source_checkpoint") or {}).get("task"), task_name,
                           reference.model.tokenizer, reference.vocab_size, checkpoint)
    inputs, targets = task.sample("test", samples, seed)
    length = min(inputs.shape[1], manifest["max_seq_len"])
    return Plan(checkpoint, artifact, manifest, reference, task, inputs[:, :length],
                targets[:, :length], seed)


def run(plan: Plan, limits: Thresholds | None = None, progress=None) -> dict:
    """The check; `limits` default to those of the artifact's scheme (`Thresholds.of`)."""
    from psa_edge.runtime.session import open_session

    limits = limits or Thresholds.of(plan.scheme)
    reference = plan.reference.logits(plan.inputs)
    session = open_session(plan.artifact)
    candidate = []
    for row in plan.inputs:  # token by token, as a device decodes
        candidate.append(feed_chunks(session, row, [1] * len(row)))
        if progress is not None:
            progress()
    metrics = compare(reference, np.stack(candidate), plan.targets, plan.task, plan.inputs)
    language_model = plan.task.name == "text"
    failed = failures(metrics, limits, language_model)
    manifest = plan.manifest
    return {"checkpoint": str(plan.checkpoint), "artifact": str(plan.artifact),
            "task": plan.task.to_dict(), "samples": len(plan.inputs),
            "tokens_per_sample": plan.inputs.shape[1], "seed": plan.seed,
            "quantization": plan.scheme,
            "target": manifest.get("target"), "twin": bool(manifest.get("twin")),
            "size_bytes": manifest.get("size_bytes"), "metrics": metrics,
            "thresholds": {"max_acc_drop": limits.max_acc_drop, "min_top1": limits.min_top1,
                           "max_ppl_increase": limits.max_ppl_increase if language_model
                           else None},
            "failures": failed, "passed": not failed}
