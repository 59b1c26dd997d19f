"""`psa-edge inspect`: what an artifact holds, read from the artifact itself.

Contract: `inspect_artifact(path)` reads the model file (the ONNX graph, or the `.pte`
flatbuffer's execution plan of method `forward`) as well as its manifest, and refuses an
artifact whose manifest does not match it: a hash that differs, a file the parser cannot read,
inputs and outputs other than those the manifest's config implies. It runs nothing. ONNX: ops
are node types. `.pte`: ops are the kernels the plan calls outside any delegate plus one
`delegate:<backend>` entry per delegate call.
"""

from __future__ import annotations

from pathlib import Path

from psa_edge.contract import GraphIO
from psa_edge.errors import ArtifactError
from psa_edge.io import read_artifact


def onnx_signature(data: bytes) -> tuple[list[dict], dict[str, int]]:
    import onnx

    model = onnx.load_from_string(data)

    def describe(value, kind):
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        return {"kind": kind, "name": value.name, "shape": dims, "dtype": dtype}

    io = ([describe(v, "input") for v in model.graph.input]
          + [describe(v, "output") for v in model.graph.output])
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return io, dict(sorted(ops.items()))


def pte_signature(data: bytes) -> tuple[list[dict], dict[str, int]]:
    from psa_edge.export import quiet_loggers

    quiet_loggers()
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(data)
    program = getattr(program, "program", program)
    plan = next(p for p in program.execution_plan if p.name == "forward")
    io = []
    for kind, indices in (("input", plan.inputs), ("output", plan.outputs)):
        for index in indices:
            tensor = plan.values[index].val
            sizes = list(getattr(tensor, "sizes", []))
            dtype = getattr(getattr(tensor, "scalar_type", None), "name", "?")
            io.append({"kind": kind, "name": f"#{index}", "shape": sizes, "dtype": dtype.lower()})
    ops: dict[str, int] = {}
    for chain in plan.chains:
        for instruction in chain.instructions:
            args = instruction.instr_args
            if hasattr(args, "op_index"):
                op = plan.operators[args.op_index]
                name = op.name + (f".{op.overload}" if op.overload else "")
            elif hasattr(args, "delegate_index"):
                name = f"delegate:{plan.delegates[args.delegate_index].id}"
            else:
                continue
            ops[name] = ops.get(name, 0) + 1
    return io, dict(sorted(ops.items()))


def inspect_artifact(path: str | Path) -> dict:
    artifact = read_artifact(path)
    manifest = artifact.manifest
    onnx = manifest["target"] == "onnx"
    try:
        io, ops = (onnx_signature if onnx else pte_signature)(artifact.data)
    except Exception as exc:  # noqa: BLE001 - protobuf and flatbuffer parsers raise anything
        raise ArtifactError(f"{artifact.model_path} is not a readable "
                            f"{'ONNX model' if onnx else 'ExecuTorch program'} "
                            f"({type(exc).__name__}: {' '.join(str(exc).split())[:120]})")
    graph_io = GraphIO.from_manifest(manifest)
    names = [e["name"] for e in io]
    if onnx and names != list(graph_io.input_names) + list(graph_io.output_names):
        raise ArtifactError(f"{artifact.model_path}: the graph's input and output names are not "
                            f"those its manifest's config implies")
    graph_io.check_signature([e["shape"] for e in io if e["kind"] == "input"],
                             [e["shape"] for e in io if e["kind"] == "output"],
                             str(artifact.model_path))
    # .pte values are unnamed; the manifest names them in order (ONNX: the same names).
    for entry, name in zip(io, manifest["io"]["inputs"] + manifest["io"]["outputs"]):
        entry["name"] = name
    return {"artifact": str(artifact.folder), "manifest": manifest, "io": io, "ops": ops,
            "delegation": manifest.get("delegation")}
