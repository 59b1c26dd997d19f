"""ExecuTorch targets: `.pte` programs for XNNPACK (delegated) and portable (no delegate).

Contract: `XNNPACK` and `PORTABLE` provide the pipeline's target stages.
- `trace`: torch.export (non-strict) of every method of the form (explicit-state: `forward`
  and `decode`; runner: `forward`);
- `quantize`: the PT2E flow on `forward` (`quantize.quantize_pt2e`), every method re-traced
  from the one converted module (shared weights); int4: torchao's 8da4w on a copy of the
  form's module (`quantize.quantize_8da4w`), every method traced again; XNNPACK only;
- `lower`: `to_edge_transform_and_lower` of all methods, no-op expands removed (XNNPACK's edge
  transforms), with the XNNPACK partitioner for `xnnpack` (none for `portable`), the form's
  constant methods added; serialized (methods share their weights: executorch deduplicates the
  constants, XNNPACK's packed ones through its named data store). XNNPACK programs come with the
  delegation report of method `forward` (`get_delegation_info`: delegated subgraphs, delegated
  fraction, every op left outside the delegate with its count and reason), the other methods'
  reports under `methods`; portable programs have none.
"""

from __future__ import annotations

import copy

import torch

from psa_edge.contract import MODEL_FILES
from psa_edge.export import quantize as q
from psa_edge.export import quiet
from psa_edge.export.forms import ModelFiles, Traced

# Why an op stays outside XNNPACK, by op-name prefix (checked against the XNNPACK partitioner
# configs of executorch 1.4.1). An op outside the delegate with no reason here is reported as
# unexplained; the tests require there is none.
WHY_OUTSIDE = {
    "aten_embedding": "token lookup (gather): XNNPACK has no embedding op",
    "aten_index_select": "gather (XNNPACK has none): the runner form's previous-key slot from "
                         "its raw-key window",
    "aten_mean_dim": "RMSNorm's mean over the hidden dim: XNNPACK's mean.dim takes 4-D inputs "
                     "only (global average pooling)",
    "aten_slice_copy": "sequence shift of the shear, RoPE halves: XNNPACK "
                       "refuses slices of tensors with a dynamic dim",
    "aten_cat": "concatenation along a dynamic dim (onto the caches; the raw keys of the "
                "layers stacked)",
    "aten_arange": "positions and the causal mask, built once per call",
    "aten_le": "causal mask, once per call",
    "aten_bitwise_not": "causal mask, once per call",
    "aten_where": "causal mask to additive bias, once per call; the runner form's window rows",
    "aten_full": "causal mask to additive bias, once per call",
    "aten_repeat": "causal mask: positions of GQA's stacked query rows, once per call",
    "aten_add_tensor": "start position + arange (int64 positions), once per call",
    "aten_index_put": "writing the raw-key window (runner form)",
    "llama_custom_sdpa": "ExecuTorch's llama flash-attention kernel over the static cache's "
                         "rows so far (runner form)",
    "_local_scalar_dense": "the start position as an integer for the llama kernels, once per "
                           "call (runner form)",
    "aten_gt": "input_pos > 0 test of the zero boundary (runner form)",
    "aten_ge": "which positions of a chunk fit the raw-key window (runner form)",
    "aten_remainder": "row of a position in the raw-key window (runner form)",
    "aten_clamp": "previous position of a call, int64, once per call (runner form)",
    "aten_select": "last position of a chunk (runner form)",
    "aten_sub_tensor": "position arithmetic on int64 (runner form)",
    "aten__to_copy": "dtype cast of positions, once per call",
    "aten_view": "reshape (no data movement)",
    "aten_unsqueeze": "reshape (no data movement)",
    "aten_squeeze": "reshape (no data movement)",
    "aten_expand": "broadcast copy (expand), no arithmetic",
    "aten_permute": "layout change between delegate calls",
    "aten_clone": "copy between delegate calls",
    "dim_order_ops": "memory-format conversion between delegate calls",
    "getitem": "graph plumbing (tuple outputs)",
    "sym_size": "symbolic shape read (dynamic dims)",
    "add": "symbolic shape arithmetic (dynamic dims)",
    "mul": "symbolic shape arithmetic (dynamic dims)",
    "scalar_tensor": "constant scalar",
    "auto_functionalized": "ExecuTorch's llama update_cache, the chunk's keys and values into "
                           "the static cache (functional in the edge graph, serialized as the "
                           "in-place kernel) (runner form)",
    "_assert_scalar": "bounds of the start position, checked once per call (runner form)",
    # Exact names below (each a prefix of nothing else that reaches a report): SymInt tests.
    "ge": "symbolic bound check of the start position (runner form)",
    "le": "symbolic bound check of the start position (runner form)",
}


def why_outside(op: str) -> str | None:
    return next((why for prefix, why in WHY_OUTSIDE.items() if op.startswith(prefix)), None)


def export_program(module: torch.nn.Module, inputs: tuple, shapes
                   ) -> torch.export.ExportedProgram:
    with quiet(), torch.no_grad():
        return torch.export.export(module, inputs, dynamic_shapes=shapes, strict=False)


def to_edge(program, delegated: bool, constant_methods: dict | None = None):
    """The EdgeProgramManager of one ExportedProgram or of a dict name -> ExportedProgram:
    XNNPACK-partitioned when `delegated`, plain edge ops otherwise."""
    from executorch.backends.xnnpack.utils.configs import get_transform_passes
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    partitioners = []
    if delegated:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioners = [XnnpackPartitioner()]
    # ExecuTorch's XNNPACK recipe, applied to both targets: drop the identity expand_copy that
    # aten.matmul's decomposition puts on attention's operands. Left in, each is a portable
    # copy of a layer's whole key or value cache on every step (outside the delegate in
    # XNNPACK programs): a sixth of psa-4m's fp32 XNNPACK decode step at 64 tokens of context,
    # a quarter of its int8 one (docs/history/decode-profile.md), and more as the context grows.
    with quiet():
        return to_edge_transform_and_lower(
            program, partitioner=partitioners, constant_methods=constant_methods,
            transform_passes=get_transform_passes(),
            compile_config=EdgeCompileConfig(_check_ir_validity=False))


def delegation_report(info) -> dict:
    outside = {b.op_type: b.non_delegated for b in info.delegation_by_operator.values()
               if b.non_delegated}
    delegated, left = info.num_delegated_nodes, info.num_non_delegated_nodes
    return {"backend": "XnnpackBackend", "delegated_subgraphs": info.num_delegated_subgraphs,
            "delegated_nodes": delegated, "non_delegated_nodes": left,
            "delegated_fraction": round(delegated / max(1, delegated + left), 4),
            "ops_outside_delegate": {op: {"count": n, "why": why_outside(op)}
                                     for op, n in sorted(outside.items())}}


class ExecuTorchTarget:
    backend = "executorch"
    activation_dtype = "int8"
    tool = ("torchao pt2e (prepare_pt2e / convert_pt2e) + executorch XNNPACKQuantizer; int4: "
            "torchao quantize_ (Int8DynamicActivationIntxWeightConfig, 8da4w)")

    def __init__(self, name: str, delegated: bool):
        self.name, self.delegated = name, delegated
        # quantized builds need a backend with integer kernels: the portable ones have none.
        self.schemes = ("int8", "int8-dynamic", "int4") if delegated else ()

    @staticmethod
    def block_layout(spec: q.QuantSpec) -> tuple[str, str]:
        """(weights, activations) of int4, as the manifest records them."""
        return (f"int4 symmetric, groups of {spec.group_size} along the input, one scale each "
                f"(HQQ scale-only)", "int8 per token, asymmetric, dynamic")

    def trace(self, module, form, cfg, max_len: int) -> dict[str, Traced]:
        return {name: Traced(export_program(module, example.inputs, example.shapes), example)
                for name, example in form.methods(cfg, max_len).items()}

    def quantize(self, exported, form, model, max_len: int, spec: q.QuantSpec, rows):
        cfg = model.cfg
        if spec.scheme == "int4":  # a source transform: on a copy, then traced again
            module = q.quantize_8da4w(form.module(copy.deepcopy(model), max_len),
                                      spec.group_size)
            ops = q.pt2e_op_histograms(exported["forward"].program.graph, q.is_linear)
            return self.trace(module, form, cfg, max_len), ops
        args = form.calibration_inputs(cfg, max_len, rows)
        # One calibrated, converted module; every method is re-traced from it (shared weights).
        module, ops = q.quantize_pt2e(exported["forward"].program, spec, args)
        return {name: Traced(q.retrace(module, t.example.inputs, t.example.flat_shapes),
                             t.example) for name, t in exported.items()}, ops

    def side_files(self, cfg, max_len: int, form: str) -> dict[str, dict]:
        return {}  # the runner reads the program's own metadata methods and the tokenizer

    def lower(self, exported, form, cfg, max_len: int) -> tuple[ModelFiles, dict | None]:
        from executorch.devtools.backend_debug import get_delegation_info
        from executorch.exir import ExecutorchBackendConfig

        programs = {name: t.program for name, t in exported.items()}
        edge = to_edge(programs, self.delegated, form.constant_methods(cfg, max_len))
        reports = {name: delegation_report(get_delegation_info(
            edge.exported_program(name).graph_module)) for name in programs}
        # In place, the runner form's raw-window writes (index_put_) copy no buffer. XNNPACK
        # only: in a portable program, a view of a written buffer gets memory of its own in
        # executorch 1.4.1's planning and reads garbage (the parity probe refuses it).
        config = ExecutorchBackendConfig(run_reinplace_pass=self.delegated)
        with quiet():
            files = ModelFiles({MODEL_FILES[self.name]: edge.to_executorch(config).buffer})
        if not self.delegated:
            return files, None
        report = reports.pop("forward")
        if reports:
            report["methods"] = reports
        return files, report


XNNPACK = ExecuTorchTarget("xnnpack", delegated=True)
PORTABLE = ExecuTorchTarget("portable", delegated=False)
