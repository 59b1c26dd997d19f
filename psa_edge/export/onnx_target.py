"""ONNX target: the explicit-state graph through torch.onnx's dynamo exporter (opset 18+).

Contract: `export_onnx_program(model, max_seq_len)` gives the ONNX program with the I/O names of
`graphs.input_names/output_names`, dynamic `seq_len` (>= 1) and `past_len` (>= 0, an empty past
works); `serialize_onnx` checks a ModelProto with `onnx.checker.check_model(full_check=True)` and returns
single-file model bytes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
import torch

from psa_edge.errors import ExportError
from psa_edge.export.graphs import (ExplicitStateGraph, dynamic_shapes, example_inputs,
                                    input_names)
from psa_edge.model.transformer import PSATransformer


@contextlib.contextmanager
def quiet():
    """The exporters print progress and warnings of their own; keep the CLI's output ours."""
    # torchao warns on import about its optional CUDA kernels, which a CPU build lacks.
    for name in ("torch", "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def export_onnx_program(model: PSATransformer, max_seq_len: int, decode: bool = False,
                        graph: ExplicitStateGraph | None = None):
    """The explicit-state graph as a torch.onnx ONNXProgram (dynamo exporter, optimized).
    `decode=True` fixes the chunk length at 1 (a decode-only graph); `graph` replaces
    `ExplicitStateGraph(model)` by a subclass with other outputs (`graph_outputs()`). Both are
    for tools/decode_profile.py's comparisons; the exporter ships neither."""
    cfg = model.cfg
    graph = (graph or ExplicitStateGraph(model)).eval()
    # Example sizes 3 and 4: torch.export specialises dims whose example size is 0 or 1.
    with quiet(), torch.no_grad():
        return torch.onnx.export(
            graph, example_inputs(cfg, 1 if decode else 3, 4),
            dynamic_shapes=dynamic_shapes(cfg, max_seq_len, decode),
            input_names=input_names(cfg), output_names=graph.graph_outputs(), dynamo=True,
            optimize=True, verbose=False)


def serialize_onnx(proto) -> bytes:
    """Single-file model bytes of a ModelProto, after `onnx.checker.check_model(full_check=True)`."""
    import onnx

    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"exported ONNX graph fails onnx.checker: {str(exc).splitlines()[0]}")
    return proto.SerializeToString()
