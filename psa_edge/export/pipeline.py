"""The export pipeline, in one place: load -> transform -> export -> quantize -> lower -> save.

Contract: `run_export(request)` checks the request (target, form, max length, quantization,
output) before any heavy work, then runs the stages in order. The target (`TARGETS`) and the
form (the registered `contract.GraphForm`, and the torch half it names in `export/forms.py`)
are objects that provide what differs between them, so no stage branches on their names. `quantize`
is a pass-through for float exports. `save` builds the artifact
folder under a temporary name (model files, tokenizer, manifest), opens it as a device would and
checks parity against the eager fp32 reference (`checks.parity`; the reference's answers,
`Evidence`, are taken first and the eager model dropped, so the weights are not held twice),
records the artifact's own
fingerprint for the first open elsewhere (`runtime.guard`), and only then renames the folder
into place (docs/reference/spec.md §8); a failed check leaves nothing behind. The folder also holds
the reference's logits on `verify`'s probes (`reference.npz`), so `psa-edge verify` runs on a
device without torch or the checkpoint. `run_export(request, started)` calls `started(stage)`
as each of `STAGES` begins (the CLI's progress bar).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

from psa_edge.checks.parity import (INT8_PROBE_LEN, PROBE_LEN, Expected, expected_logits,
                                    failure_message, probe_parity)
from psa_edge.checks.reference import Reference
from psa_edge.checks.verify import REFERENCE, reference_record
from psa_edge.contract import DEFAULT_FORM, MANIFEST, FORMS, get_form, resolve
from psa_edge.errors import ExportError
from psa_edge.export import quantize as q
from psa_edge.export.executorch_target import PORTABLE, XNNPACK
from psa_edge.export.forms import ModelFiles, Traced, graph_io
from psa_edge.export.onnx_target import ONNX
from psa_edge.io import (atomic_directory, check_output, manifest_path, refuse_overlap,
                         sha256_file, versions, write_json)
from psa_edge.model.checkpoint import load_checkpoint, tokenizer_of
from psa_edge.model.config import ModelConfig
from psa_edge.model.transformer import PSATransformer, twin_of
from psa_edge.tokenizer import Tokenizer

TARGETS = {target.name: target for target in (XNNPACK, PORTABLE, ONNX)}

Exported = dict[str, Traced]  # method name -> traced graph


@dataclass(frozen=True)
class ExportRequest:
    checkpoint: Path
    target: str
    output: Path | None = None
    max_seq_len: int | None = None
    twin: bool = False
    form: str = DEFAULT_FORM
    quant: q.QuantSpec | None = None
    text: tuple[str, ...] = ()  # held-out text of a quantized export (default: the recorded task)

    def default_output(self) -> Path:
        parts = [Path(self.checkpoint).stem, self.target]
        suffix = get_form(self.form).suffix
        if suffix:
            parts.append(suffix)
        if self.quant:
            parts.append(self.quant.scheme)
            if self.quant.group_size != q.WEIGHT_BLOCK:
                parts.append(f"g{self.quant.group_size}")
        if self.twin:
            parts.append("twin")
        return Path(self.checkpoint).with_name("-".join(parts))

    @cached_property
    def stages(self):
        """The target and the form's export object (built once; every stage asks for it)."""
        return TARGETS[self.target], resolve(get_form(self.form).exporter)(self.form)


def check_request(req: ExportRequest) -> ExportRequest:
    if req.target not in TARGETS:
        raise ExportError(f"unknown target {req.target!r}; choose one of {', '.join(TARGETS)}")
    if req.form not in FORMS:
        raise ExportError(f"unknown form {req.form!r}; choose one of {', '.join(FORMS)}")
    if not isinstance(req.twin, bool):  # the manifest records it, and readers check its type
        raise ExportError(f"twin must be true or false, got {req.twin!r}")
    form = FORMS[req.form]
    if req.target not in form.targets:
        raise ExportError(f"the {req.form} form is not built for --target {req.target}; use "
                          f"--target {' or '.join(form.targets)}")
    if req.max_seq_len is not None and req.max_seq_len < PROBE_LEN:
        raise ExportError(f"--max-seq-len {req.max_seq_len} is below the parity probe length "
                          f"{PROBE_LEN}")
    if req.quant is not None:
        q.check_spec(req.quant, TARGETS[req.target].schemes)
        if req.quant.scheme not in form.schemes:
            raise ExportError(f"the {req.form} form takes --quantize "
                              f"{', '.join(form.schemes)}, not {req.quant.scheme}")
    output = Path(req.output) if req.output else req.default_output()
    check_output(output, directory=True)
    refuse_overlap([output], [req.checkpoint, manifest_path(req.checkpoint)])
    return dataclasses.replace(req, output=output)


def load(req: ExportRequest) -> tuple[PSATransformer, dict, object]:
    """The model, the manifest's record of its source, and the held-out task of a quantized
    export (`held_out`)."""
    model, metadata = load_checkpoint(req.checkpoint)
    source = {"checkpoint": str(req.checkpoint), "sha256": sha256_file(req.checkpoint),
              "task": metadata.get("task")}
    return model, source, held_out(req, model, source["task"])


def held_out(req: ExportRequest, model: PSATransformer, recorded: dict | None):
    """The task whose train split calibrates a quantized export and whose test split is its
    parity probe: text given with `--text`, else the checkpoint's own. Built (the corpus read,
    the vocabulary checked) before any trace, so a request that cannot be calibrated or probed
    is refused in seconds. None for a float export."""
    from psa_edge.errors import PsaEdgeError
    from psa_edge.tasks import task_from_dict
    from psa_edge.tasks.text import TextTask, read_corpus

    if req.quant is None:
        return None
    if not req.text and recorded is None:
        raise ExportError(f"--quantize {req.quant.scheme} is calibrated and checked on held-out "
                          f"text or task data, and {req.checkpoint} records no task: pass "
                          f"--text PATH (files, folders or globs)")
    tokenizer = tokenizer_of(model)
    try:
        task = (TextTask(read_corpus(req.text), tokenizer, min(INT8_PROBE_LEN, max_len(model, req)))
                if req.text else task_from_dict(recorded, tokenizer))
        for split in ("train", "test"):
            task.sample(split, 1, 0)  # a split too short to draw from is refused here
    except PsaEdgeError as exc:
        raise ExportError(f"held-out data for --quantize: {exc}")
    # A recorded task's vocabulary is the model's; --text's is the model's own tokenizer's,
    # which the checkpoint's loader already bounds by the model's (a padded vocabulary is fine).
    if not req.text and task.vocab_size != model.cfg.vocab_size:
        raise ExportError(f"the task {task.name} has vocabulary {task.vocab_size}, the model's "
                          f"is {model.cfg.vocab_size}")
    return task


def transform(model: PSATransformer, req: ExportRequest) -> PSATransformer:
    """fp32, eval mode; with `twin`, the same weights with gamma set to 0
    (docs/reference/spec.md §1)."""
    if req.twin:
        model = twin_of(model)
    return model.float().eval()


def max_len(model: PSATransformer, req: ExportRequest) -> int:
    return req.max_seq_len or model.cfg.max_position_embeddings


def export(model: PSATransformer, req: ExportRequest) -> Exported:
    """The form's module traced by the target, per method."""
    target, form = req.stages
    length = max_len(model, req)
    return target.trace(form.module(model, length), form, model.cfg, length)


def quantize(exported: Exported, model: PSATransformer, task, req: ExportRequest
             ) -> tuple[Exported, dict | None]:
    """int8 (docs/reference/spec.md §6) or, for a float export, a pass-through; and the manifest's
    record of it."""
    spec = req.quant
    if spec is None:
        return exported, None
    target, form = req.stages
    length = max_len(model, req)
    tokens = q.calibration_tokens(task, spec, length) if spec.static else None
    rows = [] if tokens is None else list(tokens)
    quantized, ops = target.quantize(exported, form, model, length, spec, rows)
    record = q.calibration_record(task.to_dict(), tokens, spec, target)
    return quantized, {**record, **ops}


def lower(exported: Exported, model: PSATransformer, req: ExportRequest
          ) -> tuple[ModelFiles, dict | None]:
    target, form = req.stages
    return target.lower(exported, form, model.cfg, max_len(model, req))


@dataclass(frozen=True)
class Evidence:
    """What `save` needs of the eager model, taken before the model is dropped, so that opening
    the new artifact for its parity check does not hold a second copy of the weights (SmolLM2-135M
    fp32: the process held 1.12 GB before the model was dropped, 0.61 GB after)."""
    cfg: ModelConfig
    max_len: int
    tokenizer: Tokenizer
    reference: bytes  # verify's recorded reference (`REFERENCE`)
    parity: Expected  # the parity probe's eager logits

    @classmethod
    def of(cls, model: PSATransformer, task, req: ExportRequest) -> "Evidence":
        reference, length = Reference(model), max_len(model, req)
        return cls(model.cfg, length, tokenizer_of(model),
                   reference_record(reference, model.cfg.vocab_size, length),
                   expected_logits(reference, task, length))


def save(artifact: ModelFiles, delegation: dict | None, quantization: dict | None,
         evidence: Evidence, source: dict, req: ExportRequest, seconds: float) -> dict:
    cfg, length = evidence.cfg, evidence.max_len
    target, form = req.stages
    manifest = {
        "kind": "artifact", "target": req.target, "form": req.form, "backend": target.backend,
        "quantization": quantization, "twin": req.twin, "max_seq_len": length,
        "source_checkpoint": source, "config": cfg.to_dict(), "variant": cfg.variant,
        "gamma_q": cfg.gamma_q, "gamma_k": cfg.gamma_k,
        "io": graph_io(cfg, length, form.name).manifest_block(), "delegation": delegation,
        "versions": versions(), "export_seconds": round(seconds, 2),
    }
    with atomic_directory(req.output) as folder:
        manifest["size_bytes"] = artifact.write(folder)
        evidence.tokenizer.write(folder, length)
        (folder / REFERENCE).write_bytes(evidence.reference)
        for name, content in target.side_files(cfg, length, form.name).items():
            write_json(folder / name, content)
        manifest["files"] = {p.name: sha256_file(p) for p in sorted(folder.iterdir())}
        write_json(folder / MANIFEST, manifest)
        manifest["parity"] = parity = probe_parity(evidence.parity, folder)
        if not parity["passed"]:
            raise ExportError(failure_message(parity))
        manifest["self_check"] = parity.pop("self_check")
        write_json(folder / MANIFEST, manifest)
    return manifest


STAGES = ("load", "transform", "export", "quantize", "lower", "save")


def run_export(req: ExportRequest, started: Callable[[str], None] = lambda stage: None) -> dict:
    req = check_request(req)
    began = time.time()
    started("load")
    model, source, task = load(req)
    started("transform")
    model = transform(model, req)
    started("export")
    exported = export(model, req)
    started("quantize")
    exported, quantization = quantize(exported, model, task, req)
    started("lower")
    artifact, delegation = lower(exported, model, req)
    started("save")
    evidence = Evidence.of(model, task, req)
    del model, exported  # the last references to the eager weights: freed before the open
    return save(artifact, delegation, quantization, evidence, source, req, time.time() - began)
