"""int8 and int4 quantization: the `quantize` stage of the export pipeline
(docs/reference/spec.md §6).

Contract:
- `QuantSpec` names a scheme: `int8` (static activations, calibrated) or `int8-dynamic`
  (activation scales computed at run time), whose weights are int8, per-channel symmetric;
  `int4`, 4-bit symmetric weights with int8 activations computed at run time: on ONNX in
  blocks of `group_size` (default WEIGHT_BLOCK) along the input dimension, one scale per block
  (ONNX Runtime's MatMulNBits, accuracy level 4: the kernel quantizes the activations per
  block); on XNNPACK the same groups with activations quantized per token (torchao's 8da4w, a
  source transform before torch.export, run by XNNPACK's QD8-F32-QB4W kernels);
  `int8-block` (ONNX only), the same MatMulNBits layout with 8-bit weights (llama.cpp's Q8_0).
  `group_size` is a power of two of at least 32, for the block-wise schemes only.
- What is quantized: every linear (q/k/v/o, the SwiGLU MLP, lm_head). Optionally (static only)
  the shear's Sub/Mul/Add, when `keep_shear_fp32` is False. Everything else stays fp32: RMSNorm,
  RoPE, the attention matmuls, softmax and the mask, and the state tensors at the graph's
  boundary, so an int8 artifact has exactly the float artifact's I/O and cache shapes.
  The default keeps the shear fp32: quantizing it cost top-1 agreement on the default model
  (docs/results/quantization.md, tools/quant_table.py).
- Calibration (static) feeds `calibration_samples` sequences of the export's held-out task (the
  checkpoint's own, or text given with `--text`), train split, drawn deterministically from
  `seed`, through the graph from the empty state.
- ExecuTorch int8: torchao's `prepare_pt2e`/`convert_pt2e` with ExecuTorch's `XNNPACKQuantizer`,
  scoped to `aten.linear` by `set_operator_type` (executorch 1.4.1's `set_filter_function` is
  not honoured by its `cat` annotator, which then quantizes the KV-cache concatenation), plus
  `ShearQuantizer` for the shear. Every method is re-traced from the one converted module,
  whose shear shifts are first reattached as `ops.previous` (`reattach_shifts`), so the S = 1
  `decode` method needs no op for them, as in fp32. ExecuTorch int4: `quantize_8da4w` on a copy
  of the form's module, then every method traced again.
  ONNX: ONNX Runtime's `quant_pre_process`, then QDQ `quantize_static` with a calibration
  reader, `quantize_dynamic`, or (int4) `MatMulNBitsQuantizer`.
- `summary` of each returns the manifest's `quantization` record: scheme, calibration set,
  quantized and float op histograms.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from psa_edge.contract import SCHEMES
from psa_edge.errors import ExportError
from psa_edge.export import quiet
from psa_edge.io import native_output_captured

# The default block: llama.cpp's Q4_0 / Q8_0 one, so the block-wise builds compare like for like
# with its GGUFs (docs/results/benchmarks.md). `--group-size` takes a larger power of two: fewer
# scales, a faster XNNPACK int4 prefill, a coarser grid (docs/results/quantization.md).
WEIGHT_BLOCK = 32
BLOCK_BITS = {"int8-block": 8, "int4": 4}  # weight bits of the block-wise (MatMulNBits) schemes
CALIBRATION_SEED_BASE = 0x0CA1  # calibration draws never reuse the trainer's batch seeds
aten = torch.ops.aten


@dataclass(frozen=True)
class QuantSpec:
    scheme: str
    calibration_samples: int = 32
    seed: int = 0
    keep_shear_fp32: bool = True
    group_size: int = WEIGHT_BLOCK  # weights per scale, block-wise schemes only

    @property
    def block_wise(self) -> bool:
        return self.scheme in BLOCK_BITS

    @property
    def static(self) -> bool:
        return self.scheme == "int8"


def check_spec(spec: QuantSpec, target_schemes: tuple[str, ...]) -> None:
    if spec.scheme not in SCHEMES:
        raise ExportError(f"unknown quantization {spec.scheme!r}; choose one of "
                          f"{', '.join(SCHEMES)}")
    if spec.scheme not in target_schemes:
        targets = "onnx" if spec.scheme == "int8-block" else "xnnpack or onnx"
        raise ExportError(f"{spec.scheme} needs a backend with its kernels; use --target "
                          f"{targets}")
    if spec.group_size != WEIGHT_BLOCK and not spec.block_wise:
        raise ExportError(f"--group-size applies to the block-wise schemes "
                          f"({', '.join(BLOCK_BITS)}), not to {spec.scheme}")
    # XNNPACK's QB4W kernels take multiples of 32; MatMulNBits, powers of two
    if spec.group_size < WEIGHT_BLOCK or spec.group_size & (spec.group_size - 1):
        raise ExportError(f"--group-size must be a power of two of at least {WEIGHT_BLOCK}, "
                          f"got {spec.group_size}")
    if spec.static and spec.calibration_samples < 1:
        raise ExportError(f"--calibration-samples must be positive, got "
                          f"{spec.calibration_samples}")
    if not spec.static and not spec.keep_shear_fp32:
        raise ExportError(f"{spec.scheme} quantizes linears only; the shear cannot be quantized "
                          f"with dynamic activations (drop --quantize-shear)")


def calibration_tokens(task, spec: QuantSpec, max_len: int) -> np.ndarray:
    """`[n, T]` token ids from the train split of the held-out task (deterministic; its
    vocabulary was checked against the model's when the export built it)."""
    tokens, _ = task.sample("train", spec.calibration_samples, CALIBRATION_SEED_BASE + spec.seed)
    return tokens[:, :max_len]


def activations(spec: QuantSpec, target) -> str:
    """How the linears' input activations are quantized (the manifest's record). ONNX Runtime's
    CPU kernels want them as uint8, ExecuTorch's XNNPACK quantizer makes int8; each target
    describes its own low-bit layouts."""
    if spec.block_wise:
        return target.block_layout(spec)[1]
    dtype = target.activation_dtype
    return (f"{dtype} per-tensor, static (calibrated)" if spec.static
            else f"{dtype}, dynamic (scales computed per call)")


def calibration_record(task_dict: dict | None, tokens: np.ndarray | None, spec: QuantSpec,
                       target) -> dict:
    weights = target.block_layout(spec)[0] if spec.block_wise else "int8 per-channel symmetric"
    record = {"scheme": spec.scheme, "tool": target.tool, "weights": weights,
              "activations": activations(spec, target),
              "keep_shear_fp32": spec.keep_shear_fp32, "calibration": None}
    if tokens is not None:
        record["calibration"] = {
            "task": task_dict, "split": "train", "samples": int(tokens.shape[0]),
            "tokens_per_sample": int(tokens.shape[1]), "seed": spec.seed,
            "tokens_sha256": hashlib.sha256(tokens.astype(np.int64).tobytes()).hexdigest()}
    return record


def histogram(names) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names:
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------
# ExecuTorch: PT2E

def shift_operands(node) -> tuple | None:
    """(stream, prev) when `node` is the general form of `ops.previous(stream, prev)`,
    `cat([prev, stream], -2)[..., :-1, :]`, in an aten-level FX graph; else None."""
    if getattr(node, "target", None) != aten.slice.Tensor:
        return None
    cat, dim, start, end, step = list(node.args) + [0, None, None, 1][len(node.args) - 1:]
    value = node.meta.get("val")  # the slice's own; convert_pt2e's Q/DQ nodes have none
    rank = value.dim() if value is not None else 0
    if rank < 2 or dim % rank != rank - 2 or start not in (0, None) or end != -1 or step != 1:
        return None
    if (getattr(cat, "target", None) != aten.cat.default or len(cat.args) < 2
            or len(cat.args[0]) != 2 or cat.args[1] % rank != rank - 2):
        return None
    prev, stream = cat.args[0]
    return stream, prev


def shear_chains(graph: torch.fx.Graph) -> list[tuple]:
    """(sub, mul, add) of every shear `x + gamma (x - prev(x))` in an aten-level FX graph: a Sub
    of a stream and its one-step shift (`shift_operands`), its Mul, and the Add of that Mul back
    onto the stream."""
    chains = []
    for sub in graph.nodes:
        if sub.target != aten.sub.Tensor:
            continue
        stream, shifted = sub.args[:2]
        shift = shift_operands(shifted)
        if shift is None or shift[0] is not stream:
            continue
        for mul in (u for u in sub.users if u.target == aten.mul.Tensor):
            for add in (u for u in mul.users if u.target == aten.add.Tensor and stream in u.args):
                chains.append((sub, mul, add))
    return chains


def make_shear_quantizer(act_spec):
    """A PT2E quantizer that annotates the shear's Sub, Mul and Add with static int8
    activations (ExecuTorch's XNNPACKQuantizer has no pattern for sub)."""
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, Quantizer

    class ShearQuantizer(Quantizer):
        def annotate(self, model):
            for sub, mul, add in shear_chains(model.graph):
                for node, inputs in ((sub, sub.args[:2]), (mul, [sub]), (add, add.args)):
                    node.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={a: act_spec for a in inputs
                                         if isinstance(a, torch.fx.Node)},
                        output_qspec=act_spec, _annotated=True)
            return model

        def validate(self, model):
            pass

    return ShearQuantizer()


def quantize_pt2e(program: torch.export.ExportedProgram, spec: QuantSpec,
                  calibration_args: list[tuple]) -> tuple[torch.fx.GraphModule, dict]:
    """The converted (Q/DQ) module of a program and the quantized / float op histograms of
    its annotated graph. `calibration_args` are the argument tuples fed to the prepared module;
    with none (dynamic), the program's example inputs are fed once, because the weight
    observers only compute per-channel scales after a forward pass (unobserved, they fall back
    to one default scale and XNNPACK refuses the weights)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.composable_quantizer import ComposableQuantizer

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=not spec.static)
    quantizers = [XNNPACKQuantizer().set_operator_type(aten.linear.default, config)]
    if not spec.keep_shear_fp32:
        quantizers.append(make_shear_quantizer(config.input_activation))
    example = program.example_inputs[0]
    with quiet(), torch.no_grad():
        module = prepare_pt2e(program.module(), ComposableQuantizer(quantizers))
        ops = pt2e_op_histograms(module.graph)
        # Eagerly, the runner form's llama ops run ExecuTorch's kernels, which log natively
        # (a CPU probe; "no temp allocator provided"): not the user's concern.
        with native_output_captured():
            for args in calibration_args or [example]:
                module(*args)
        converted = convert_pt2e(module)
    reattach_shifts(converted)
    return converted, ops


def quantize_8da4w(module: torch.nn.Module, group_size: int = WEIGHT_BLOCK) -> torch.nn.Module:
    """`module` with every linear's weight in 4-bit symmetric groups of `group_size` along the
    input, one scale each, and its input quantized to int8 per token at run time (torchao's
    8da4w, as ExecuTorch's own LLM export applies it before torch.export; XNNPACK runs it as
    QD8-F32-QB4W), in place. ExecuTorch 1.4.1's XNNPACKQuantizer has no per-group weights:
    PT2E could only give one scale per output channel, too coarse for 4 bits.
    Each scale is HQQ's least-squares fit (scale only, from max |w| / 8), ExecuTorch's
    `quantize_with_hqq`: on the shipped code pair it cut the perplexity increase from +1.80% /
    +1.58% (max |w| / 7.5) to +1.26% / +1.26%, and lifted the twin's top-1 from 0.896, under
    quant-check's int4 floor, to 0.905."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    linears = {name: m for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, linear in linears.items():
        if linear.in_features % group_size:
            raise ExportError(f"int4 on XNNPACK needs every linear's input size to be a multiple "
                              f"of its group size {group_size}; {name} takes "
                              f"{linear.in_features}")
    config = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(group_size),
        intx_choose_qparams_algorithm="hqq_scale_only")
    with quiet(), torch.no_grad():
        quantize_(module, config, filter_fn=lambda m, _: isinstance(m, torch.nn.Linear))
    return module


def reattach_shifts(module: torch.fx.GraphModule) -> int:
    """Turn the shear's shift `cat([prev, x], -2)[..., :-1, :]` of a converted (dynamic-length)
    module back into calls of `ops.previous`, in place. Traced with a dynamic length it emits
    the same cat/slice again; re-traced with a static length of 1 (ExecuTorch's `decode` method)
    it emits nothing, as in the float export, instead of a concat and a slice per sheared
    stream. Returns how many were reattached."""
    from psa_edge.model import ops

    graph, count = module.graph, 0
    for node in list(graph.nodes):
        shift = shift_operands(node)
        if shift is None:
            continue
        with graph.inserting_before(node):
            call = graph.call_function(ops.previous, shift)
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        count += 1
    graph.eliminate_dead_code()
    module.recompile()
    return count


def retrace(module: torch.fx.GraphModule, example: tuple, flat_shapes: tuple
            ) -> torch.export.ExportedProgram:
    """torch.export of a converted module for one method's inputs (flat: the unlifted module
    takes the state tensors as separate arguments)."""
    with quiet(), torch.no_grad():
        return torch.export.export(module, example, dynamic_shapes=flat_shapes, strict=False)


def annotated_for_quantization(node: torch.fx.Node) -> bool:
    """Whether a PT2E quantizer annotated this linear or shear op (Sub/Mul/Add) to be
    quantized."""
    annotation = node.meta.get("quantization_annotation")
    return node.target in (aten.linear.default, aten.sub.Tensor, aten.mul.Tensor,
                           aten.add.Tensor) and annotation is not None and \
        annotation._annotated and (annotation.output_qspec is not None
                                   or annotation.input_qspec_map)


def is_linear(node: torch.fx.Node) -> bool:
    """What a source transform of every linear (8da4w) quantizes."""
    return node.target == aten.linear.default


def pt2e_op_histograms(graph: torch.fx.Graph, quantized=annotated_for_quantization) -> dict:
    """Counts of the graph's ops that `quantized` says are quantized, and of the others."""
    annotated, plain = [], []
    for node in graph.nodes:
        if node.op != "call_function" or "observer" in node.name:
            continue
        name = str(node.target).removeprefix("aten.")
        if quantized(node):
            annotated.append(name)
        elif not name.startswith(("sym_size", "getitem", "_assert", "_guards")):
            plain.append(name)
    return {"quantized_ops": histogram(annotated), "float_ops": histogram(plain)}


# ---------------------------------------------------------------------------------------------
# ONNX: ONNX Runtime quantization

def onnx_weight_matmuls(model) -> list[str]:
    initializers = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul"
            and n.input[1] in initializers]


def onnx_shear_nodes(model) -> list[str]:
    """Names of the Sub, Mul, Add nodes of every shear in an ONNX graph (same structure as
    `shear_chains`: Sub(x, Slice(Concat(prev, x))) -> Mul(gamma) -> Add(., x))."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    names = []
    for sub in (n for n in model.graph.node if n.op_type == "Sub"):
        stream, shifted = sub.input
        source = producer.get(shifted)
        while source is not None and source.op_type == "Slice":
            source = producer.get(source.input[0])
        if source is None or source.op_type != "Concat" or stream not in source.input:
            continue
        for mul in (c for c in consumers.get(sub.output[0], []) if c.op_type == "Mul"):
            for add in (c for c in consumers.get(mul.output[0], [])
                        if c.op_type == "Add" and stream in c.input):
                names += [sub.name, mul.name, add.name]
    return names


def nbits_matmuls(model, names: list[str], bits: int, block: int):
    """The quantizer after replacing the MatMuls `names` by MatMulNBits (`bits`, `block`
    weights per scale; a K that is not a multiple of it is padded by the quantizer)."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger(MatMulNBitsQuantizer.__module__).setLevel(logging.WARNING)  # per node
    # accuracy level 4: int8 activations inside the kernel, its fast path on x86 and ARM
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block, is_symmetric=True,
                                     accuracy_level=4, nodes_to_include=names)
    quantizer.process()
    return quantizer.model


def quantize_onnx(source: Path, out: Path, spec: QuantSpec, calibration_feeds: list[dict]
                  ) -> dict:
    """Quantize the ONNX model at `source` (weights as external data) after ONNX Runtime's
    pre-processing into `out` (the same layout) and return the op histograms.
    `calibration_feeds` are the input dicts of the calibration reader (static only). On files:
    ONNX Runtime's quantizers then never serialize the weights inside one protobuf (SmolLM2-135M
    int8-dynamic from one in-memory graph did not finish in 37 minutes; from files, 17 s)."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_dynamic, quantize_static)
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(calibration_feeds)

        def get_next(self):
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory(prefix="psa-edge-pre-") as tmp, quiet():
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(source), str(pre), save_as_external_data=True,
                          all_tensors_to_one_file=True, external_data_location="pre.onnx.data")
        prepared = onnx.load(str(pre), load_external_data=False)
        targets = onnx_weight_matmuls(prepared)
        shear = [] if spec.keep_shear_fp32 else onnx_shear_nodes(prepared)
        kinds = {n.name: n.op_type for n in prepared.graph.node}  # before int4 edits it
        common = dict(per_channel=True, weight_type=QuantType.QInt8,
                      nodes_to_quantize=targets + shear, use_external_data_format=True,
                      op_types_to_quantize=["MatMul"] + (["Sub", "Mul", "Add"] if shear else []))
        if spec.scheme in BLOCK_BITS:
            nbits_matmuls(str(pre), targets, BLOCK_BITS[spec.scheme],
                          spec.group_size).save_model_to_file(str(out), True)
        elif spec.static:
            # Asymmetric activations, MinMax ranges, stored as uint8 (ONNX Runtime's U8S8, its
            # default; the same 256 levels as asymmetric int8, and the same quant-check numbers
            # on the default model). ORT's CPU provider fuses DQ -> MatMul -> Q into
            # QLinearMatMul for all 22 weight MatMuls of psa-4m with uint8 activations, for only
            # 7 with int8 ones: the other 15 dequantized their weights on every call, 6-9x
            # slower per decoded token on psa-4m and psa-30m (tools/bench_presets.py).
            quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8,
                            calibrate_method=CalibrationMethod.MinMax,
                            extra_options={"ActivationSymmetric": False}, **common)
        else:
            quantize_dynamic(str(pre), str(out), **common)
    chosen = set(targets + shear)
    return {"quantized_ops": histogram(kinds[n] for n in chosen),
            "float_ops": histogram(t for n, t in kinds.items() if n not in chosen)}
