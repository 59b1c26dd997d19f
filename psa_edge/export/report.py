"""Export summary, `psa-edge inspect` and the `quant-check` table.

Contract: `inspect_artifact(path)` reads the artifact itself (the ONNX graph, or the `.pte`
flatbuffer's execution plan) as well as its manifest, and refuses an artifact whose manifest does
not match it. ONNX: ops are node types. `.pte`: ops are the kernels the plan calls outside any
delegate plus one `delegate:<backend>` entry per delegate call.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from psa_edge.display import make_console

from psa_edge.runtime.graph import read_manifest


def onnx_signature(path: Path) -> tuple[list[dict], dict[str, int]]:
    import onnx

    model = onnx.load(str(path))

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


def pte_signature(path: Path) -> tuple[list[dict], dict[str, int]]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(path.read_bytes())
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
    path = Path(path)
    manifest = read_manifest(path)
    io, ops = (onnx_signature(path) if manifest["target"] == "onnx" else pte_signature(path))
    # .pte values are unnamed; the manifest names them in order (ONNX: the same names).
    for entry, name in zip(io, manifest["io"]["inputs"] + manifest["io"]["outputs"]):
        entry["name"] = name
    return {"artifact": str(path), "manifest": manifest, "io": io, "ops": ops,
            "delegation": manifest.get("delegation")}


def print_summary(manifest: dict) -> None:
    console = make_console()
    parity = manifest["parity"]
    errors = parity["max_abs_logit_error"]
    console.print(f"wrote [bold]{manifest['artifact']}[/] ({manifest['size_bytes'] / 1e6:.2f} MB, "
                  f"{manifest['target']}, {manifest['form']}, {manifest['variant']} "
                  f"gamma_k={manifest['gamma_k']} gamma_q={manifest['gamma_q']}, "
                  f"max_seq_len {manifest['max_seq_len']}) in {manifest['export_seconds']} s")
    agreement = ""
    if parity.get("min_agreement") is not None:
        a, d = parity["argmax_agreement"], parity["decided_argmax_agreement"]
        agreement = (f"; argmax agreement {a['all_at_once']:.3f} / {a['token_by_token']:.3f}, "
                     f"on the {parity['decided_positions']} decided positions "
                     f"{d['all_at_once']:.3f} / {d['token_by_token']:.3f} (needs >= "
                     f"{parity['min_agreement']})")
    console.print(f"parity vs eager fp32 on a {parity['probe_len']}-token probe: max |dlogit| "
                  f"all at once {errors['all_at_once']:.2e}, token by token "
                  f"{errors['token_by_token']:.2e} (tolerance {parity['tolerance']:.2e})"
                  f"{agreement} -> {'PASS' if parity['passed'] else 'FAIL'}")
    if manifest.get("quantization"):
        qrec = manifest["quantization"]
        console.print(f"quantization {qrec['scheme']}: weights {qrec['weights']}, activations "
                      f"{qrec['activations']}; quantized ops {qrec['quantized_ops']}; shear "
                      f"{'fp32' if qrec['keep_shear_fp32'] else 'int8'}")
    if manifest.get("delegation"):
        print_delegation(console, manifest["delegation"])


def print_delegation(console: Console, d: dict) -> None:
    console.print(f"delegation: {d['delegated_subgraphs']} {d['backend']} subgraph(s), "
                  f"{d['delegated_nodes']} of {d['delegated_nodes'] + d['non_delegated_nodes']} "
                  f"nodes delegated ({100 * d['delegated_fraction']:.1f}%)")
    if d["ops_outside_delegate"]:
        table = Table("op outside the delegate", "count", "why")
        for op, entry in d["ops_outside_delegate"].items():
            table.add_row(op, str(entry["count"]), entry["why"] or "[red]unexplained[/]")
        console.print(table)


def print_inspection(info: dict) -> None:
    console = make_console()
    m = info["manifest"]
    head = Table(title=f"{Path(info['artifact']).name}", show_header=False)
    for key in ("target", "form", "variant", "gamma_q", "gamma_k", "twin", "max_seq_len",
                "quantization", "size_bytes"):
        head.add_row(key, str(m.get(key)))
    head.add_row("source checkpoint", f"{m['source_checkpoint']['checkpoint']} "
                 f"(sha256 {m['source_checkpoint']['sha256'][:12]}...)")
    head.add_row("parity max abs err", str(m["parity"]["max_abs_logit_error"]))
    console.print(head)
    io = Table("kind", "name", "shape", "dtype", title="I/O signature")
    for e in info["io"]:
        io.add_row(e["kind"], e["name"], str(e["shape"]), e["dtype"])
    console.print(io)
    ops = Table("op", "count", title="op histogram")
    for op, count in info["ops"].items():
        ops.add_row(op, str(count))
    console.print(ops)
    if info["delegation"]:
        print_delegation(console, info["delegation"])


def quant_check_table(result: dict) -> None:
    m = result["metrics"]
    console = make_console()
    task = result["task"]
    table = Table("metric", "float (reference)", f"artifact ({result['quantization']})", "delta",
                  title=f"quant-check {Path(result['artifact']).name}: {task['name']}, "
                        f"{result['samples']} held-out sequences x {result['tokens_per_sample']}"
                        f" tokens, token by token")
    table.add_row("task accuracy", f"{m['accuracy_float']:.4f}", f"{m['accuracy_artifact']:.4f}",
                  f"{m['accuracy_delta_points']:+.2f} points")
    table.add_row("target perplexity (scored positions)", f"{m['target_perplexity_float']:.4f}",
                  f"{m['target_perplexity_artifact']:.4f}",
                  f"x {m['target_perplexity_ratio']:.4f}")
    for label, value in (("top-1 agreement", f"{m['top1_agreement']:.4f}"),
                         ("KL(float || artifact) mean / p99 / max",
                          f"{m['kl_mean']:.2e} / {m['kl_p99']:.2e} / {m['kl_max']:.2e}"),
                         ("RMS dp on the reference's top token", f"{m['rms_dp_top']:.4f}"),
                         ("max abs logit error", f"{m['max_abs_logit_error']:.4f}")):
        table.add_row(label, "", value, "")
    console.print(table)
    limits = result["thresholds"]
    verdict = "PASS" if result["passed"] else "FAIL"
    console.print(f"{verdict}: accuracy drop <= {limits['max_acc_drop']:g} points and top-1 "
                  f"agreement >= {limits['min_top1']:g}")
