"""The ONNX target: explicit-state graphs for ONNX Runtime (opset 18+).

Contract: `ONNX` provides the pipeline's target stages. Between them a model lives on disk as
`OnnxFiles`: the graph and, beside it, its weights as external data (`contract.ONNX_DATA`), so
no stage holds a serialized copy of the weights and a model past protobuf's 2 GB limit exports.
- `trace`: torch.onnx's dynamo exporter (optimized) of the form's `forward`, with the contract's
  I/O names, dynamic chunk length S (>= 1) and past length P (>= 0: an empty past works); or,
  for a form that writes its own graph (the fused form), that graph;
- `quantize`: ONNX Runtime's quantizer (`quantize.quantize_onnx`), calibration inputs fed by
  name;
- `lower`: `onnx.checker.check_model(full_check=True)` on the saved graph; the artifact's files
  are the graph and its weights; no delegation report.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from psa_edge.contract import MODEL_FILES, ONNX_DATA
from psa_edge.errors import ExportError
from psa_edge.export import quantize as q
from psa_edge.export import quiet
from psa_edge.export.forms import ModelFiles, Traced, graph_io


# Tensors of at least this many bytes go to the external file; smaller ones (shapes, scalars)
# stay in the graph, where onnx.checker and a reader of the graph alone see them.
EXTERNAL_MIN_BYTES = 1024


class OnnxFiles:
    """An ONNX model on disk: the graph (`model.onnx`) and its weights as external data beside it
    (`ONNX_DATA`), in a scratch folder this object owns and removes when it is dropped."""

    def __init__(self):
        self._scratch = tempfile.TemporaryDirectory(prefix="psa-edge-onnx-")
        self.path = Path(self._scratch.name) / MODEL_FILES["onnx"]

    @classmethod
    def of_proto(cls, proto) -> "OnnxFiles":
        """Saved from a ModelProto, whose tensors are moved out to the file as they are written."""
        import onnx

        files = cls()
        onnx.save_model(proto, files.path, save_as_external_data=True,
                        all_tensors_to_one_file=True, location=ONNX_DATA,
                        size_threshold=EXTERNAL_MIN_BYTES)
        return files

    @classmethod
    def of_ir(cls, model) -> "OnnxFiles":
        """Saved from the exporter's IR model: its tensors (views of the module's) are written
        one at a time, never serialized together."""
        import onnx_ir

        files = cls()
        onnx_ir.save(model, files.path, external_data=ONNX_DATA,
                     size_threshold_bytes=EXTERNAL_MIN_BYTES)
        return files

    @classmethod
    def of_file(cls, path: Path) -> "OnnxFiles":
        """Another tool's output (any external-data layout), saved again in this one."""
        import onnx

        return cls.of_proto(onnx.load(str(path)))

    def files(self) -> dict[str, Path]:
        """The artifact's files: the graph and (when any tensor is large enough) its weights."""
        return {p.name: p for p in (self.path, self.path.with_name(ONNX_DATA)) if p.exists()}


def release_rewriter_state() -> None:
    """Drop what onnxscript's rewrite rules remember of their last match. The rules live at
    module level and each matcher keeps the last graph it looked at, whose initializers are the
    exported module's own weight tensors: the eager weights then outlived the model, through
    the parity check and the process (SmolLM2-135M: the export held 0.6 GB more). Found with
    gc.get_referrers; onnxscript 0.7.2."""
    import gc

    from onnxscript.rewriter._matcher import PatternMatcher

    for obj in gc.get_objects():
        if isinstance(obj, PatternMatcher):
            for state in ("_graph", "_current_node", "_match", "_tracer"):
                if state in obj.__dict__:
                    obj.__dict__[state] = None


class OnnxTarget:
    name = "onnx"
    backend = "onnxruntime"
    schemes = ("int8", "int8-dynamic", "int8-block", "int4")
    activation_dtype = "uint8"  # ONNX Runtime's CPU kernels want U8S8 (quantize.quantize_onnx)
    tool = "onnxruntime.quantization (quant_pre_process, QDQ static / dynamic, MatMulNBits)"

    @staticmethod
    def block_layout(spec: q.QuantSpec) -> tuple[str, str]:
        """(weights, activations) of a block-wise scheme, as the manifest records them."""
        bits, block = q.BLOCK_BITS[spec.scheme], spec.group_size
        return (f"int{bits} symmetric, blocks of {block} along the input, one scale each",
                f"int8 per block of {block}, dynamic (inside MatMulNBits)")

    def trace(self, module, form, cfg, max_len: int) -> dict[str, Traced]:
        example = form.methods(cfg, max_len)["forward"]
        if form.build_onnx is not None:
            files = OnnxFiles.of_proto(form.build_onnx(module, max_len))
            return {"forward": Traced(files, example)}
        io = graph_io(cfg, max_len, form.name)
        with quiet(), torch.no_grad():
            program = torch.onnx.export(
                module, example.inputs, dynamic_shapes=example.shapes,
                input_names=list(io.input_names), output_names=list(io.output_names),
                dynamo=True, optimize=True, verbose=False)
        files = OnnxFiles.of_ir(program.model)
        release_rewriter_state()
        return {"forward": Traced(files, example)}

    def quantize(self, exported, form, model, max_len: int, spec: q.QuantSpec, rows):
        cfg = model.cfg
        io = graph_io(cfg, max_len, form.name)
        feeds = [dict(zip(io.input_names, (t.numpy() for t in inputs)))
                 for inputs in form.calibration_inputs(cfg, max_len, rows)]
        with tempfile.TemporaryDirectory(prefix="psa-edge-quantize-") as scratch:
            out = Path(scratch) / "quantized.onnx"
            ops = q.quantize_onnx(exported["forward"].program.path, out, spec, feeds)
            files = OnnxFiles.of_file(out)
        return {"forward": Traced(files, exported["forward"].example)}, ops

    def side_files(self, cfg, max_len: int, form: str) -> dict[str, dict]:
        """What ONNX clients read beside the graph: config.json and generation_config.json
        (optimum's ORTModelForCausalLM, transformers) and, for a form whose I/O
        onnxruntime-genai feeds (`GraphForm.onnx_clients`: the raw-key form, and the
        explicit-state form without slots; not the fused form's input_pos and logits_to_keep),
        genai_config.json."""
        from psa_edge.hf.convert import genai_config, generation_config, llama_config

        io = graph_io(cfg, max_len, form)
        files = {"config.json": llama_config(cfg, remote_code=False),
                 "generation_config.json": generation_config(cfg)}
        if "onnxruntime-genai" in io.spec.onnx_clients(io):
            files["genai_config.json"] = genai_config(cfg, max_len, io.spec.genai_inputs(io))
        return files

    def lower(self, exported, form, cfg, max_len: int) -> tuple[ModelFiles, None]:
        import onnx

        files = exported["forward"].program
        try:  # on the path: the checker reads the weights from their file
            onnx.checker.check_model(str(files.path), full_check=True)
        except onnx.checker.ValidationError as exc:
            raise ExportError(f"exported ONNX graph fails onnx.checker: "
                              f"{str(exc).splitlines()[0]}")
        return ModelFiles(files.files(), owner=files), None


ONNX = OnnxTarget()
