"""The export pipeline, in one place: load -> transform -> export -> quantize -> lower -> save.

Contract: `run_export(request)` checks the request (target, form, max length, quantization,
output) before any heavy work, then runs the stages in order. The target (`TARGETS`) and the
form (the registered `contract.GraphForm`, and the torch half it names in `export/forms.py`)
are objects that provide what differs between them, so no stage branches on their names. `quantize`
is a pass-through for float exports. `save` builds the artifact
folder under a temporary name (model file, tokenizer, manifest), opens it as a device would and
checks parity against the eager fp32 reference (`checks.parity`), records the artifact's own
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

from psa_edge.checks.parity import PROBE_LEN, failure_message, probe_parity
from psa_edge.checks.reference import Reference
from psa_edge.checks.verify import REFERENCE, record_reference
from psa_edge.contract import DEFAULT_FORM, MANIFEST, MODEL_FILES, FORMS, get_form, resolve
from psa_edge.errors import ExportError
from psa_edge.export import quantize as q
from psa_edge.export.executorch_target import PORTABLE, XNNPACK
from psa_edge.export.forms import Traced, graph_io
from psa_edge.export.onnx_target import ONNX
from psa_edge.io import (atomic_directory, check_output, manifest_path, refuse_overlap,
                         sha256_file, versions, write_json)
from psa_edge.model.checkpoint import load_checkpoint, tokenizer_of
from psa_edge.model.transformer import PSATransformer, twin_of

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


def load(req: ExportRequest) -> tuple[PSATransformer, dict]:
    model, metadata = load_checkpoint(req.checkpoint)
    return model, {"checkpoint": str(req.checkpoint), "sha256": sha256_file(req.checkpoint),
                   "task": metadata.get("task")}


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


def quantize(exported: Exported, model: PSATransformer, source: dict, req: ExportRequest
             ) -> tuple[Exported, dict | None]:
    """int8 (docs/reference/spec.md §6) or, for a float export, a pass-through; and the manifest's
    record of it."""
    spec = req.quant
    if spec is None:
        return exported, None
    target, form = req.stages
    length = max_len(model, req)
    tokens = (q.calibration_tokens(source["task"], spec, model.cfg.vocab_size, length,
                                   model.tokenizer) if spec.static else None)
    rows = [] if tokens is None else list(tokens)
    quantized, ops = target.quantize(exported, form, model, length, spec, rows)
    record = q.calibration_record(source["task"], tokens, spec, target)
    return quantized, {**record, **ops}


def lower(exported: Exported, model: PSATransformer, req: ExportRequest
          ) -> tuple[bytes, dict | None]:
    target, form = req.stages
    return target.lower(exported, form, model.cfg, max_len(model, req))


def save(artifact: bytes, delegation: dict | None, quantization: dict | None,
         model: PSATransformer, source: dict, req: ExportRequest, seconds: float) -> dict:
    cfg, length = model.cfg, max_len(model, req)
    target, form = req.stages
    manifest = {
        "kind": "artifact", "target": req.target, "form": req.form, "backend": target.backend,
        "quantization": quantization, "twin": req.twin, "max_seq_len": length,
        "source_checkpoint": source, "config": cfg.to_dict(), "variant": cfg.variant,
        "gamma_q": cfg.gamma_q, "gamma_k": cfg.gamma_k,
        "io": graph_io(cfg, length, form.name).manifest_block(), "delegation": delegation,
        "versions": versions(), "export_seconds": round(seconds, 2), "size_bytes": len(artifact),
    }
    with atomic_directory(req.output) as folder:
        (folder / MODEL_FILES[req.target]).write_bytes(artifact)
        tokenizer_of(model).write(folder, length)
        record_reference(Reference(model), cfg.vocab_size, length, folder / REFERENCE)
        for name, content in target.side_files(cfg, length, form.name).items():
            write_json(folder / name, content)
        manifest["files"] = {p.name: sha256_file(p) for p in sorted(folder.iterdir())}
        write_json(folder / MANIFEST, manifest)
        manifest["parity"] = parity = probe_parity(Reference(model), folder)
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
    model, source = load(req)
    started("transform")
    model = transform(model, req)
    started("export")
    exported = export(model, req)
    started("quantize")
    exported, quantization = quantize(exported, model, source, req)
    started("lower")
    artifact, delegation = lower(exported, model, req)
    started("save")
    return save(artifact, delegation, quantization, model, source, req, time.time() - began)
