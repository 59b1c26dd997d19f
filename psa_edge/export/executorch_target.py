"""ExecuTorch targets: `.pte` programs for XNNPACK (delegated) and portable (no delegate).

Contract:
- `export_program(graph, inputs, shapes)` is torch.export (non-strict) of a graph form.
- `to_edge(programs, target)` runs `to_edge_transform_and_lower` on one program or a dict of
  methods, no-op expands removed (XNNPACK's edge transforms), with the XNNPACK partitioner for
  `xnnpack` (none for `portable`); `lower_pte`
  serializes it (methods share their weights: executorch deduplicates the constants, XNNPACK's
  packed ones through its named data store) and returns the program bytes and the delegation
  report of method `forward` (`get_delegation_info`: delegated subgraphs, delegated fraction,
  every op left outside the delegate with its count), with the other methods' reports under
  `methods`.
- `runner_metadata(cfg, max_seq_len)` are the constant methods ExecuTorch's LLM runner reads.
"""

from __future__ import annotations

import torch

from psa_edge.export.onnx_target import quiet
from psa_edge.model.config import ModelConfig

# Why an op stays outside XNNPACK, by op-name prefix (checked against the XNNPACK partitioner
# configs of executorch 1.4.1). An op outside the delegate with no reason here is reported as
# unexplained; the tests require there is none.
WHY_OUTSIDE = {
    "aten_embedding": "token lookup (gather): XNNPACK has no embedding op",
    "aten_index_select": "GQA: the KV head of each query head gathered from the cache "
                         "(XNNPACK has no gather)",
    "aten_mean_dim": "RMSNorm's mean over the hidden dim: XNNPACK's mean.dim takes 4-D inputs "
                     "only (global average pooling)",
    "aten_slice_copy": "sequence shift of the shear, RoPE halves: XNNPACK "
                       "refuses slices of tensors with a dynamic dim",
    "aten_cat": "concatenation along a dynamic dim (onto the caches; the raw keys of the "
                "layers stacked)",
    "aten_arange": "positions and the causal mask, built once per call",
    "aten_le": "causal mask, once per call",
    "aten_bitwise_not": "causal mask, once per call",
    "aten_where": "causal mask to additive bias, once per call",
    "aten_full": "causal mask to additive bias, once per call",
    "aten_add_tensor": "start position + arange (int64 positions), once per call",
    "aten_index_copy": "writing the static cache at input_pos (runner form)",
    "aten_index_put": "writing the static cache at input_pos (runner form)",
    "aten_copy": "updating the previous-key slot buffer (runner form)",
    "aten_gt": "input_pos > 0 test of the zero boundary (runner form)",
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
    "scalar_tensor": "constant scalar",
}


def why_outside(op: str) -> str | None:
    return next((why for prefix, why in WHY_OUTSIDE.items() if op.startswith(prefix)), None)


def export_program(graph: torch.nn.Module, inputs: tuple, shapes) -> torch.export.ExportedProgram:
    with quiet(), torch.no_grad():
        return torch.export.export(graph, inputs, dynamic_shapes=shapes, strict=False)


def runner_metadata(cfg: ModelConfig, max_seq_len: int) -> dict:
    # The induction vocabularies have no end-of-sequence token. Without get_eos_ids the runner
    # would take the tokenizer's default (id 0) and stop on an ordinary token, so an id no
    # model emits (vocab_size) stands in.
    eos = cfg.eos_token_id if cfg.eos_token_id is not None else cfg.vocab_size
    return {"get_max_seq_len": max_seq_len, "get_max_context_len": max_seq_len,
            "get_vocab_size": cfg.vocab_size, "use_kv_cache": True,
            "enable_dynamic_shape": True,
            "get_bos_id": cfg.bos_token_id if cfg.bos_token_id is not None else 0,
            "get_eos_ids": [eos]}


def to_edge(program, target: str, constant_methods: dict | None = None):
    """The EdgeProgramManager of one ExportedProgram or of a dict name -> ExportedProgram:
    XNNPACK-partitioned for `xnnpack`, plain edge ops for portable."""
    from executorch.backends.xnnpack.utils.configs import get_transform_passes
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    partitioners = []
    if target == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioners = [XnnpackPartitioner()]
    # ExecuTorch's XNNPACK recipe, applied to both targets: drop the identity expand_copy that
    # aten.matmul's decomposition puts on attention's operands. Left in, each is a portable
    # copy of a layer's whole key or value cache on every step (outside the delegate in
    # XNNPACK programs): a sixth of psa-4m's fp32 XNNPACK decode step at 64 tokens of context,
    # a quarter of its int8 one (docs/decode-profile.md), and more as the context grows.
    with quiet():
        return to_edge_transform_and_lower(
            program, partitioner=partitioners, constant_methods=constant_methods,
            transform_passes=get_transform_passes(),
            compile_config=EdgeCompileConfig(_check_ir_validity=False))


def lower_pte(programs: dict, target: str, constant_methods: dict | None = None
              ) -> tuple[bytes, dict]:
    from executorch.devtools.backend_debug import get_delegation_info

    edge = to_edge(programs, target, constant_methods)
    reports = {name: delegation_report(
        get_delegation_info(edge.exported_program(name).graph_module), target)
        for name in programs}
    with quiet():
        buffer = edge.to_executorch().buffer
    report = reports.pop("forward")
    if reports:
        report["methods"] = reports
    return buffer, report


def delegation_report(info, target: str) -> dict:
    outside = {b.op_type: b.non_delegated for b in info.delegation_by_operator.values()
               if b.non_delegated}
    delegated, left = info.num_delegated_nodes, info.num_non_delegated_nodes
    return {"backend": "XnnpackBackend" if target == "xnnpack" else None,
            "delegated_subgraphs": info.num_delegated_subgraphs,
            "delegated_nodes": delegated, "non_delegated_nodes": left,
            "delegated_fraction": round(delegated / max(1, delegated + left), 4),
            "ops_outside_delegate": {op: {"count": n, "why": why_outside(op)}
                                     for op, n in sorted(outside.items())}}
