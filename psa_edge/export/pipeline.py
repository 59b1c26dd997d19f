"""The export pipeline, in one place: load -> transform -> export -> quantize -> lower -> save.

Contract: `run_export(request)` checks the request (target, form, max length, quantization,
output directory) before any heavy work, then runs the stages in order. `quantize` is a
pass-through for float exports and the int8 flow of `quantize.py` otherwise. `save` writes the
artifact under a temporary name, checks parity against the eager fp32 reference on it (fp32
tolerance, or the int8 agreement/error bounds of `parity.py`), and only then renames it into
place and writes its manifest (SPEC §7); a failed parity check leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from psa_edge.errors import ExportError
from psa_edge.export import executorch_target as et
from psa_edge.export import quantize as q
from psa_edge.export.graphs import (ExplicitStateGraph, RunnerGraph, dynamic_shapes,
                                    example_inputs, input_names, output_names, raw_fields,
                                    state_fields, state_shape)
from psa_edge.export.onnx_target import export_onnx_program, serialize_onnx
from psa_edge.export.parity import PROBE_LEN, failure_message, probe_parity
from psa_edge.io import atomic_output, check_writable_dir, sha256_file, versions, write_manifest
from psa_edge.model.checkpoint import load_checkpoint
from psa_edge.model.transformer import PSATransformer, twin_of
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
    quant: q.QuantSpec | None = None

    def default_output(self) -> Path:
        parts = [self.checkpoint.stem] + ([] if self.target == "onnx" else [self.target])
        if self.form == "runner":
            parts.append("runner")
        if self.quant:
            parts.append(self.quant.scheme)
        if self.twin:
            parts.append("twin")
        return self.checkpoint.with_name(".".join(parts) + SUFFIX[self.target])


@dataclass(frozen=True)
class Traced:
    """One method's traced graph (an ExportedProgram, or the ONNX ModelProto) and what
    re-tracing it needs: flat example inputs and dynamic shapes, one entry per graph input."""
    program: object
    example: tuple
    flat_shapes: tuple


Exported = dict[str, Traced]  # method name -> traced graph


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
    if req.quant is not None:
        q.check_spec(req.quant, req.target)
    output = Path(req.output) if req.output else req.default_output()
    check_writable_dir(output)
    return dataclasses.replace(req, output=output)


def load(req: ExportRequest) -> tuple[PSATransformer, dict]:
    model, metadata = load_checkpoint(req.checkpoint)
    return model, {"checkpoint": str(req.checkpoint), "sha256": sha256_file(req.checkpoint),
                   "task": metadata.get("task")}


def transform(model: PSATransformer, req: ExportRequest) -> PSATransformer:
    """fp32, eval mode; with `twin`, the same weights with gamma set to 0 (SPEC §1)."""
    if req.twin:
        model = twin_of(model)
    return model.float().eval()


def max_len(model: PSATransformer, req: ExportRequest) -> int:
    return req.max_seq_len or model.cfg.max_position_embeddings


def export(model: PSATransformer, req: ExportRequest) -> Exported:
    """torch.export of the requested graph form, per method (ONNX: one ModelProto)."""
    cfg, length = model.cfg, max_len(model, req)
    if req.target == "onnx":
        return {"forward": Traced(export_onnx_program(model, length).model_proto, (), ())}
    if req.form == "runner":
        from torch.export import Dim

        graph = RunnerGraph(model, length).eval()
        inputs = (torch.zeros(1, 3, dtype=torch.long), torch.tensor([0], dtype=torch.long))
        shapes = ({1: Dim("seq_len", min=1, max=length)}, None)
        return {"forward": Traced(et.export_program(graph, inputs, shapes), inputs, shapes)}
    graph, methods = ExplicitStateGraph(model).eval(), {}
    for name, seq_len in (("forward", 3), ("decode", 1)):
        # Example sizes 3 and 4: torch.export specialises dims whose example size is 0 or 1.
        inputs = example_inputs(cfg, seq_len, 4)
        shapes = dynamic_shapes(cfg, length, decode=name == "decode")
        methods[name] = Traced(et.export_program(graph, inputs, shapes), inputs,
                               (shapes[0], *shapes[1]))
    return methods


def quantize(exported: Exported, model: PSATransformer, source: dict, req: ExportRequest
             ) -> tuple[Exported, dict | None]:
    """int8 (SPEC §5) or, for a float export, a pass-through. Returns the manifest record."""
    spec = req.quant
    if spec is None:
        return exported, None
    cfg, tokens = model.cfg, None
    if spec.static:
        tokens = q.calibration_tokens(source["task"], spec, cfg.vocab_size, max_len(model, req))
    rows = [] if tokens is None else list(tokens)
    if req.target == "onnx":
        empty = {f"past_key_values.{i}.{f}": np.zeros(state_shape(cfg, f, 0), np.float32)
                 for i in range(cfg.num_hidden_layers) for f in state_fields(cfg)}
        feeds = [{"input_ids": row[None].astype(np.int64), **empty} for row in rows]
        proto, ops = q.quantize_onnx(exported["forward"].program, spec, feeds)
        quantized = {"forward": Traced(proto, (), ())}
        tool = "onnxruntime.quantization (quant_pre_process, QDQ static / dynamic)"
    else:
        if req.form == "runner":
            args = [(torch.from_numpy(r)[None], torch.tensor([0])) for r in rows]
        else:
            args = [(torch.from_numpy(r)[None], *example_inputs(cfg, 1, 0)[1:]) for r in rows]
        # One calibrated, converted module; every method is re-traced from it (shared weights).
        module, ops = q.quantize_pt2e(exported["forward"].program, spec, args)
        quantized = {name: Traced(q.retrace(module, t.example, t.flat_shapes), t.example,
                                  t.flat_shapes) for name, t in exported.items()}
        tool = "torchao pt2e (prepare_pt2e / convert_pt2e) + executorch XNNPACKQuantizer"
    record = q.calibration_record(source["task"], tokens, spec, tool, req.target)
    return quantized, {**record, **ops}


def lower(exported: Exported, model: PSATransformer, req: ExportRequest
          ) -> tuple[bytes, dict | None]:
    if req.target == "onnx":
        return serialize_onnx(exported["forward"].program), None
    constants = (et.runner_metadata(model.cfg, max_len(model, req)) if req.form == "runner"
                 else None)
    return et.lower_pte({name: t.program for name, t in exported.items()}, req.target,
                        constants)


def save(artifact: bytes, delegation: dict | None, quantization: dict | None,
         model: PSATransformer, source: dict, req: ExportRequest, seconds: float) -> dict:
    cfg = model.cfg
    manifest = {
        "kind": "artifact", "target": req.target, "form": req.form,
        "backend": "onnxruntime" if req.target == "onnx" else "executorch",
        "quantization": quantization, "twin": req.twin, "max_seq_len": max_len(model, req),
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
            raise ExportError(failure_message(parity))
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
    exported = export(model, req)
    exported, quantization = quantize(exported, model, source, req)
    artifact, delegation = lower(exported, model, req)
    return save(artifact, delegation, quantization, model, source, req, time.time() - started)
