"""The ONNX target: explicit-state graphs for ONNX Runtime (opset 18+).

Contract: `ONNX` provides the pipeline's target stages.
- `trace`: torch.onnx's dynamo exporter (optimized) of the form's `forward`, with the contract's
  I/O names, dynamic chunk length S (>= 1) and past length P (>= 0: an empty past works); or,
  for a form that writes its own graph (the fused form), that graph;
- `quantize`: ONNX Runtime's quantizer (`quantize.quantize_onnx`), calibration inputs fed by
  name;
- `lower`: `onnx.checker.check_model(full_check=True)` and single-file model bytes; no
  delegation report.
"""

from __future__ import annotations

import torch

from psa_edge.errors import ExportError
from psa_edge.export import quantize as q
from psa_edge.export import quiet
from psa_edge.export.forms import Traced, graph_io


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
            return {"forward": Traced(form.build_onnx(module, max_len), example)}
        io = graph_io(cfg, max_len, form.name)
        with quiet(), torch.no_grad():
            program = torch.onnx.export(
                module, example.inputs, dynamic_shapes=example.shapes,
                input_names=list(io.input_names), output_names=list(io.output_names),
                dynamo=True, optimize=True, verbose=False)
        return {"forward": Traced(program.model_proto, example)}

    def quantize(self, exported, form, model, max_len: int, spec: q.QuantSpec, rows):
        cfg = model.cfg
        io = graph_io(cfg, max_len, form.name)
        feeds = [dict(zip(io.input_names, (t.numpy() for t in inputs)))
                 for inputs in form.calibration_inputs(cfg, max_len, rows)]
        proto, ops = q.quantize_onnx(exported["forward"].program, spec, feeds)
        return {"forward": Traced(proto, exported["forward"].example)}, ops

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

    def lower(self, exported, form, cfg, max_len: int) -> tuple[bytes, None]:
        import onnx

        proto = exported["forward"].program
        try:
            onnx.checker.check_model(proto, full_check=True)
        except onnx.checker.ValidationError as exc:
            raise ExportError(f"exported ONNX graph fails onnx.checker: "
                              f"{str(exc).splitlines()[0]}")
        return proto.SerializeToString(), None


ONNX = OnnxTarget()
