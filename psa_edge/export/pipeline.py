"""The export pipeline, in one place: load -> transform -> export -> quantize -> lower -> save.

Contract: `run_export(request)` checks the request (target, form, max length, output directory)
before any heavy work, then runs the stages in order. `save` writes the artifact under a
temporary name, checks parity against the eager fp32 reference on it, and only then renames it
into place and writes its manifest (SPEC §7); a failed parity check leaves nothing behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from psa_edge.errors import ExportError
from psa_edge.export import executorch_target as et
from psa_edge.export.graphs import (ExplicitStateGraph, RunnerGraph, dynamic_shapes,
                                    example_inputs, input_names, output_names, raw_fields,
                                    state_fields)
from psa_edge.export.onnx_target import export_onnx_program, serialize_onnx
from psa_edge.export.parity import PROBE_LEN, probe_parity
from psa_edge.io import atomic_output, check_writable_dir, sha256_file, versions, write_manifest
from psa_edge.model.checkpoint import load_checkpoint
from psa_edge.model.transformer import PSATransformer
from psa_edge.tokenizer import write_hf_tokenizer

TARGETS = ("xnnpack", "portable", "onnx")
FORMS = ("explicit-state", "runner")
SUFFIX = {"onnx": ".onnx", "xnnpack": ".pte", "portable": ".pte"}


@dataclass(frozen=True)
class ExportRequest:
    checkpoint: Path
    target: str
    output: Path | None = None
    max_seq_len: int | None = None
    twin: bool = False
    form: str = "explicit-state"

    def default_output(self) -> Path:
        parts = [self.checkpoint.stem] + ([] if self.target == "onnx" else [self.target])
        if self.form == "runner":
            parts.append("runner")
        if self.twin:
            parts.append("twin")
        return self.checkpoint.with_name(".".join(parts) + SUFFIX[self.target])


def check_request(req: ExportRequest) -> ExportRequest:
    if req.target not in TARGETS:
        raise ExportError(f"unknown target {req.target!r}; choose one of {', '.join(TARGETS)}")
    if req.form not in FORMS:
        raise ExportError(f"unknown form {req.form!r}; choose one of {', '.join(FORMS)}")
    if req.form == "runner" and req.target == "onnx":
        raise ExportError("the runner form is an ExecuTorch program; use --target xnnpack or "
                          "portable")
    if req.max_seq_len is not None and req.max_seq_len < PROBE_LEN:
        raise ExportError(f"--max-seq-len {req.max_seq_len} is below the parity probe length "
                          f"{PROBE_LEN}")
    output = Path(req.output) if req.output else req.default_output()
    check_writable_dir(output)
    return ExportRequest(req.checkpoint, req.target, output, req.max_seq_len, req.twin, req.form)


def load(req: ExportRequest) -> tuple[PSATransformer, dict]:
    model, metadata = load_checkpoint(req.checkpoint)
    return model, {"checkpoint": str(req.checkpoint), "sha256": sha256_file(req.checkpoint),
                   "task": metadata.get("task")}


def transform(model: PSATransformer, req: ExportRequest) -> PSATransformer:
    """fp32, eval mode; with `twin`, the same weights with gamma set to 0 (SPEC §1)."""
    if req.twin:
        twin = PSATransformer(model.cfg.twin())
        twin.load_state_dict(model.state_dict())
        model = twin
    return model.float().eval()


def max_len(model: PSATransformer, req: ExportRequest) -> int:
    return req.max_seq_len or model.cfg.max_position_embeddings


def export(model: PSATransformer, req: ExportRequest):
    """torch.export of the requested graph form (an ONNXProgram for the onnx target)."""
    cfg, length = model.cfg, max_len(model, req)
    if req.target == "onnx":
        return export_onnx_program(model, length)
    if req.form == "runner":
        from torch.export import Dim

        graph = RunnerGraph(model, length).eval()
        inputs = (torch.zeros(1, 3, dtype=torch.long), torch.tensor([0], dtype=torch.long))
        return et.export_program(graph, inputs, ({1: Dim("seq_len", min=1, max=length)}, None))
    return et.export_program(ExplicitStateGraph(model).eval(), example_inputs(cfg, 3, 4),
                             dynamic_shapes(cfg, length))


def quantize(program, req: ExportRequest):
    """Float export: the program passes through. (int8 is added here by the quantization work.)"""
    return program


def lower(program, model: PSATransformer, req: ExportRequest) -> tuple[bytes, dict | None]:
    if req.target == "onnx":
        return serialize_onnx(program), None
    methods = et.runner_metadata(model.cfg, max_len(model, req)) if req.form == "runner" else None
    return et.lower_pte(program, req.target, methods)


def save(artifact: bytes, delegation: dict | None, model: PSATransformer, source: dict,
         req: ExportRequest, seconds: float) -> dict:
    cfg = model.cfg
    manifest = {
        "kind": "artifact", "target": req.target, "form": req.form,
        "backend": "onnxruntime" if req.target == "onnx" else "executorch",
        "quantization": None, "twin": req.twin, "max_seq_len": max_len(model, req),
        "source_checkpoint": source, "config": cfg.to_dict(), "variant": cfg.variant,
        "gamma_q": cfg.gamma_q, "gamma_k": cfg.gamma_k,
        "io": {"inputs": input_names(cfg), "outputs": output_names(cfg),
               "state_fields": state_fields(cfg), "raw_fields": raw_fields(cfg)},
        "delegation": delegation, "versions": versions(), "export_seconds": round(seconds, 2),
        "size_bytes": len(artifact),
    }
    if req.form == "runner":
        manifest["io"] = {"inputs": ["tokens", "input_pos"], "outputs": ["logits"],
                          "methods": et.runner_metadata(cfg, max_len(model, req)),
                          "state_fields": state_fields(cfg)}
        manifest["tokenizer"] = tokenizer_path(req.output).name
    with atomic_output(req.output) as tmp:
        tmp.write_bytes(artifact)
        manifest["parity"] = parity = probe_parity(model, tmp, manifest)
        if not parity["passed"]:
            worst = max(parity["max_abs_logit_error"].values())
            raise ExportError(f"parity check failed: max abs logit error {worst:.3g} exceeds "
                              f"tolerance {parity['tolerance']:.3g}; no artifact written")
    if req.form == "runner":  # the tokenizer file ExecuTorch's TextLLMRunner loads
        write_hf_tokenizer(tokenizer_path(req.output), cfg.vocab_size)
    return write_manifest(req.output, manifest)


def tokenizer_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name.removesuffix(".pte") + ".tokenizer.json")


def run_export(req: ExportRequest) -> dict:
    req = check_request(req)
    started = time.time()
    model, source = load(req)
    model = transform(model, req)
    program = export(model, req)
    program = quantize(program, req)
    artifact, delegation = lower(program, model, req)
    return save(artifact, delegation, model, source, req, time.time() - started)
