"""docs/decode-profile.md: where PSA's per-token decode overhead over its gamma = 0 twin comes
from, layer by layer of one decoded token, and whether a decode-only ONNX graph removes it.

    python tools/decode_profile.py      # about 17 minutes; reuses tools/bench_presets.py's
                                        # artifacts in out/bench/ (exports them if missing,
                                        # and the variant builds: about 12 more)

Per preset and build (as in docs/benchmarks.md), one thread, at a fixed context of P tokens (the
state is restored before every call, so each call does the same work), three nested layers of
one decode step are timed:
- backend call: `InferenceSession.run` / ExecuTorch `Method.execute` on prebuilt inputs;
- graph.step: psa-edge's numpy wrapper around it (feeds in, outputs to numpy dicts);
- Session.feed: the whole runtime step (input checks, rollback bookkeeping).
Each round opens fresh sessions and times every PSA/twin pair alone, alternating in turns of
about 4 ms (A B / B A); a ratio is the geometric mean of the rounds' ratios with its 95%
interval. ONNX Runtime's own profiler splits the ONNX backend call by operator type (kernel time
per call). Then every preset's ONNX fp32 graphs are exported again with the chunk length fixed
at 1 (the shear's shift then needs no Concat/Slice) and merged with the shipped graph behind an
`If`, psa-4m's also with the graph outputs shipped before 2026-12-03 (a slot output per layer in
PSA, raw-key outputs in the twin); each is timed against the shipped dynamic-length graphs, and
what the two candidate fixes would cost to ship is measured (file size and resident memory).
Finally each piece PSA adds per layer (the shear's Sub/Mul/Add, the shift, the slot input and
raw-key output) is timed alone in ONNX Runtime, and the sum over the layers is set against the
measured overhead. The int8 XNNPACK program without `quantize.reattach_shifts` is timed against
the shipped one, and psa-4m's XNNPACK programs lowered without XNNPACK's edge transforms (the
no-op expand copies of attention's operands left outside the delegate) against the shipped
ones, PSA and twin. Last, each PSA build is exported again with the shear bypassed and its I/O
kept, which splits PSA's overhead into its slot I/O and its shear's ops on every backend.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import shutil
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from bench_presets import (BUILDS, GOAL, MAX_LEN, OUT, artifact, checkpoint,  # noqa: E402
                           cpu_times, ort_node_types, ratio_text, steal_sentence, steal_share,
                           up_to_date, verdict_of)
from psa_edge.io import write_text  # noqa: E402
from psa_edge.runtime.bench import geomean_ci, machine, set_threads  # noqa: E402
from psa_edge.runtime.graph import OnnxGraph  # noqa: E402
from psa_edge.runtime.session import open_session  # noqa: E402

TOKEN = np.array([7])
# Turns as short as psa-edge bench's (runtime.bench.TURN_SECONDS): this VM's slow spells last
# tens of milliseconds, and the two sides of a ratio should share them.
BLOCK_SECONDS = 0.004
LAYERS = ("backend call", "graph.step", "Session.feed")


def geomean(ratios) -> float:
    return geomean_ci(list(ratios))["geomean"]


def side_of_one(low: float, high: float) -> str:
    """Where a 95% interval of a time ratio lies: "above" 1, "below" 1 or "across" it."""
    return "above" if low > 1 else "below" if high < 1 else "across"


def interval(ratios) -> tuple[float, float, float]:
    """Geometric mean of per-round ratios and its 95% confidence interval."""
    summary = geomean_ci(list(ratios))
    return (summary["geomean"], *summary["ci95"])


def layer_calls(path: Path, context: np.ndarray) -> tuple[dict, dict]:
    """Zero-argument callables (with the setup each needs before a call) for the three layers of
    one decode step at P = len(context), and the graph's feeds for that step."""
    session = open_session(path, threads=1)
    session.feed(context)
    snapshot = session.snapshot()
    graph, spec = session.graph, session.spec
    feeds = {"input_ids": TOKEN.reshape(1, 1)}
    feeds.update((name_in, session.state[key]) for key, name_in in spec.state_io)
    if isinstance(graph, OnnxGraph):
        names = list(spec.output_names)
        backend = lambda: graph.session.run(names, feeds)  # noqa: E731
    else:
        from psa_edge.executorch_backend import as_torch

        args = [as_torch(feeds[n]) for n in spec.input_names]
        backend = lambda: graph.decode.execute(args)  # noqa: E731
    calls = {"backend call": (backend, None),
             "graph.step": (lambda: graph.step(TOKEN, snapshot.state), None),
             "Session.feed": (lambda: session.feed(TOKEN), lambda: session.restore(snapshot))}
    return calls, feeds


def ort_session(model: Path | bytes):
    """An ONNX Runtime CPU session on one thread, from a file or a serialized model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                providers=["CPUExecutionProvider"])


def interleaved(calls: dict[str, tuple], blocks: int) -> dict[str, float]:
    """Median seconds per call of each named (call, setup), alternating A B / B A in blocks
    of about BLOCK_SECONDS each. Meant for two cells: with more, the first and last in the
    order get double turns (A B C C B A) and run warmer than the middle ones."""
    times = defaultdict(list)
    names = list(calls)
    per_block = {}
    for name in names:  # warm-up, which also sizes the blocks
        call, setup = calls[name]
        started = time.perf_counter()
        for _ in range(10):
            setup and setup()
            call()
        per_call = (time.perf_counter() - started) / 10
        per_block[name] = max(1, min(50, round(BLOCK_SECONDS / per_call)))
    for block in range(blocks):
        for name in (names if block % 2 == 0 else names[::-1]):
            call, setup = calls[name]
            for _ in range(per_block[name]):
                if setup:
                    setup()
                started = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def ort_kernel_profiles(paths: dict[str, Path], feeds: dict[str, dict], blocks: int
                        ) -> dict[str, dict[str, float]]:
    """Per artifact: microseconds per call by ONNX operator type (kernel time), plus the whole
    run, from ONNX Runtime's profiler; the sessions alternate in blocks of 25 calls."""
    import onnxruntime as ort

    sessions = {}
    for who, path in paths.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(OUT / f"ort_profile_{who}")
        sessions[who] = ort.InferenceSession(str(path), options,
                                             providers=["CPUExecutionProvider"])
    warm, names = 20, list(paths)
    for who in names:
        for _ in range(warm):
            sessions[who].run(None, feeds[who])
    for block in range(blocks):
        for who in (names if block % 2 == 0 else names[::-1]):
            for _ in range(25):
                sessions[who].run(None, feeds[who])
    return {who: kernel_times(Path(s.end_profiling()), warm) for who, s in sessions.items()}


def kernel_times(trace_file: Path, warm: int) -> dict[str, float]:
    """Mean microseconds per run by operator type from one ORT trace (the file is removed)."""
    events = json.loads(trace_file.read_text())
    trace_file.unlink()
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "model_run")[warm:]
    starts = [ts for ts, _ in runs]
    per_op = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i >= 0 and e["ts"] <= runs[i][0] + runs[i][1]:
            per_op[e["args"]["op_name"]] += e["dur"]
    profile = {op: total / len(runs) for op, total in per_op.items()}
    profile["(all kernels)"] = sum(per_op.values()) / len(runs)
    profile["(model_run)"] = sum(d for _, d in runs) / len(runs)
    return profile


def decode_only_onnx(ckpt: Path, twin: bool) -> Path:
    """A preset's ONNX fp32 graph with the chunk length fixed at 1 (not a shipped artifact)."""
    from psa_edge.export.onnx_target import export_onnx_program, serialize_onnx
    from psa_edge.model.checkpoint import load_checkpoint
    from psa_edge.model.transformer import twin_of

    path = OUT / f"{ckpt.stem}.onnx.fp32.decode-only{'.twin' if twin else ''}.onnx"
    if not path.exists():
        model, _ = load_checkpoint(ckpt)
        model = twin_of(model) if twin else model
        write_bytes(path, serialize_onnx(export_onnx_program(model.eval(), MAX_LEN, True)
                                         .model_proto))
    return path


def merged_onnx(ckpt: Path, twin: bool) -> Path:
    """One ONNX file holding both graphs, the shipped one and the decode-only one, behind an
    `If` on the chunk length (S == 1 runs the decode-only branch), the weights stored once, as
    Hugging Face Optimum merges its decoders (not a shipped artifact)."""
    import hashlib

    import onnx
    from onnx import helper, numpy_helper

    path = OUT / f"{ckpt.stem}.onnx.fp32.merged{'.twin' if twin else ''}.onnx"
    if path.exists():
        return path
    branches = {"chunk": onnx.load(str(artifact(ckpt, "onnx", None, twin))),
                "step": onnx.load(str(decode_only_onnx(ckpt, twin)))}
    outer_inputs = list(branches["chunk"].graph.input)
    outputs = [o.name for o in branches["chunk"].graph.output]
    for prefix, model in branches.items():  # every name but the graph inputs made unique
        graph, keep = model.graph, {i.name for i in outer_inputs}
        rename = {name: f"{prefix}/{name}" for name in
                  [i.name for i in graph.initializer] + [o for n in graph.node for o in n.output]
                  if name and name not in keep}  # "" marks an omitted optional value
        for init in graph.initializer:
            init.name = rename[init.name]
        for node in graph.node:
            node.input[:] = [rename.get(i, i) for i in node.input]
            node.output[:] = [rename.get(o, o) for o in node.output]
        for value in graph.output:
            value.name = rename[value.name]
    # Weights both graphs hold (by content) move to the outer graph, stored once.
    def content(tensor) -> tuple:
        array = numpy_helper.to_array(tensor)
        return array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest()

    first = {content(t): t.name for t in branches["chunk"].graph.initializer}
    alias = {t.name: first[content(t)] for t in branches["step"].graph.initializer
             if content(t) in first}
    for node in branches["step"].graph.node:
        node.input[:] = [alias.get(i, i) for i in node.input]
    shared = set(alias.values())
    outer = [t for t in branches["chunk"].graph.initializer if t.name in shared]

    def branch(name, graph):
        own = [t for t in graph.initializer if t.name not in shared and t.name not in alias]
        return helper.make_graph(list(graph.node), name, [], [
            helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
            for o in graph.output], own)

    length = [helper.make_node("Shape", ["input_ids"], ["merge/shape"], start=1, end=2),
              helper.make_node("Squeeze", ["merge/shape"], ["merge/length"]),
              helper.make_node("Equal", ["merge/length", "merge/one"], ["merge/is_step"]),
              helper.make_node("If", ["merge/is_step"], outputs,
                               then_branch=branch("step", branches["step"].graph),
                               else_branch=branch("chunk", branches["chunk"].graph))]
    chunk = branches["chunk"]
    graph = helper.make_graph(length, "merged", outer_inputs, [
        helper.make_tensor_value_info(name, o.type.tensor_type.elem_type, None)
        for name, o in zip(outputs, chunk.graph.output)],
        outer + [numpy_helper.from_array(np.array(1, np.int64), "merge/one")])
    merged = helper.make_model(graph, opset_imports=chunk.opset_import, ir_version=chunk.ir_version)
    write_bytes(path, merged.SerializeToString())
    return path


def legacy_io_onnx(ckpt: Path, twin: bool) -> Path:
    """psa-4m's ONNX graph with the outputs psa-edge shipped before 2026-12-03: PSA returned
    each slot (`present.{i}.prev_key`) and a raw-key output per layer (`present.{i}.raw_key`),
    the twin those raw keys too, which it never needs. Same inputs, same arithmetic (not a
    shipped artifact)."""
    from psa_edge.export.graphs import ExplicitStateGraph
    from psa_edge.export.onnx_target import export_onnx_program, serialize_onnx
    from psa_edge.model.checkpoint import load_checkpoint
    from psa_edge.model.transformer import twin_of

    class LegacyIO(ExplicitStateGraph):
        def forward(self, input_ids, *past):
            logits, new_state, raws = self.model.forward_with_state(input_ids,
                                                                    self.layer_states(past))
            return (logits, *[layer[f] for layer in new_state for f in self.fields],
                    *[layer["key"] for layer in raws])

        def graph_outputs(self):
            layers = range(self.model.cfg.num_hidden_layers)
            return (["logits"] + [f"present.{i}.{f}" for i in layers for f in self.fields]
                    + [f"present.{i}.raw_key" for i in layers])

    path = OUT / f"{ckpt.stem}.onnx.fp32.legacy-io{'.twin' if twin else ''}.onnx"
    if not path.exists():
        model, _ = load_checkpoint(ckpt)
        model = (twin_of(model) if twin else model).eval()
        program = export_onnx_program(model, MAX_LEN, graph=LegacyIO(model))
        write_bytes(path, serialize_onnx(program.model_proto))
    return path


FORMS = ("dynamic", "decode-only", "merged", "legacy I/O")
UNITS = ("shear: Sub, Mul, Add (SPEC §2)", "shift: Concat, Slice",
         "slot input, a layer's part of the stacked raw output (an Add, a Concat input)")


def unit_graph(unit: str, copies: int):
    """An ONNX graph of `copies` of one of the per-layer pieces PSA adds to the twin's decode
    graph, on a `[1, Hkv, 1, dh]` stream: the shear's three elementwise ops (chained, as
    layers are), the dynamic graph's shift, or the slot input and its part of the one stacked
    raw-key output (whose fixed per-call cost is not in the slope)."""
    from onnx import TensorProto, helper

    def tensor(name, dims=None):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    nodes, inputs, outputs = [], [tensor("x"), tensor("prev")], []
    stream = "x"
    for i in range(copies):
        if unit == UNITS[0]:
            nodes += [helper.make_node("Sub", [stream, "prev"], [f"d{i}"]),
                      helper.make_node("Mul", [f"d{i}", "gamma"], [f"m{i}"]),
                      helper.make_node("Add", [f"m{i}", stream], [f"s{i}"])]
            stream = f"s{i}"
        elif unit == UNITS[1]:
            nodes += [helper.make_node("Concat", ["prev", stream], [f"c{i}"], axis=2),
                      helper.make_node("Slice", [f"c{i}", "zero", "minus1", "two"], [f"p{i}"])]
            stream = f"p{i}"
        else:  # an input needs a consumer, the raw output producers: an Add per copy
            inputs.append(tensor(f"slot{i}"))
            nodes.append(helper.make_node("Add", [f"slot{i}", stream], [f"raw{i}"]))
    if unit == UNITS[2] and copies:
        nodes.append(helper.make_node("Concat", [f"raw{i}" for i in range(copies)], ["raw"],
                                      axis=0))
        outputs.append(tensor("raw"))
    nodes.append(helper.make_node("Identity", [stream], ["y"]))
    constants = [helper.make_tensor("gamma", TensorProto.FLOAT, [], [0.8])] + [
        helper.make_tensor(name, TensorProto.INT64, [1], [value])
        for name, value in (("zero", 0), ("minus1", -1), ("two", 2))]
    graph = helper.make_graph(nodes, unit, inputs, outputs + [tensor("y")], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def unit_costs(shape: tuple, blocks: int, copies: int = 24) -> dict[str, float]:
    """Seconds each piece adds per layer to an ONNX Runtime call (one thread): the slope
    between graphs with `copies` of it and with none, so the call's fixed cost cancels."""
    rng = np.random.default_rng(0)
    costs = {}
    for unit in UNITS:  # each pair alone: `interleaved` is for two cells
        calls = {}
        for n in (0, copies):
            session = ort_session(unit_graph(unit, n).SerializeToString())
            feeds = {i.name: rng.standard_normal(shape).astype(np.float32)
                     for i in session.get_inputs()}
            calls[n] = (lambda s=session, f=feeds: s.run(None, f), None)
        times = interleaved(calls, blocks)
        costs[unit] = (times[copies] - times[0]) / copies
    return costs


def write_bytes(path: Path, data: bytes) -> None:
    from psa_edge.io import atomic_output

    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def node_count(path: Path) -> int:
    """Nodes of the graph as ONNX Runtime runs it (after its optimizations)."""
    return sum(ort_node_types(path).values())


def layers_table(rows) -> str:
    lines = ["| preset | backend | precision | layer | PSA ms | twin ms | "
             "PSA - twin (µs, median of rounds) | ratio [95% CI] |", "|" + "---|" * 8]
    for preset, target, precision, rounds in rows:
        for layer in LAYERS:
            a, b, ratios = pair_times(rounds, ("psa", layer), ("twin", layer))
            extra = pair_difference(rounds, ("psa", layer), ("twin", layer))
            lines.append(f"| {preset} | {target} | {precision} | {layer} | {a * 1e3:.4f} | "
                         f"{b * 1e3:.4f} | {extra * 1e6:+.1f} | {ratio_text(ratios)} |")
    return "\n".join(lines)


def profile_table(profiles) -> str:
    lines = []
    for (preset, precision), (psa, twin) in profiles.items():
        lines += [f"\n{preset} ONNX {precision} (µs per decode call):\n",
                  "| operator | PSA | twin | PSA - twin |", "|---|---|---|---|"]
        ops = sorted(set(psa) | set(twin), key=lambda op: (op.startswith("("), op))
        for op in ops:
            a, b = psa.get(op, 0.0), twin.get(op, 0.0)
            lines.append(f"| {op} | {a:.1f} | {b:.1f} | {a - b:+.1f} |")
        outside = [p["(model_run)"] - p["(all kernels)"] for p in (psa, twin)]
        lines.append(f"| (run minus kernels: executor, allocation, I/O) | {outside[0]:.1f} | "
                     f"{outside[1]:.1f} | {outside[0] - outside[1]:+.1f} |")
    return "\n".join(lines)


def rounds_of(paths: dict, context: np.ndarray, args, make_calls, pairs: list) -> list[dict]:
    """`args.rounds` measurements, each on freshly opened sessions, the load order alternating
    (the artifact opened first can run at another speed). In a round each pair of cells
    (a, b) is timed on its own, in turns a b b a a b ..., so both get the same turns; a round
    maps each pair to its two median seconds per call."""
    rounds = []
    for n in range(args.rounds):
        calls = {}
        for who in (list(paths) if n % 2 == 0 else list(paths)[::-1]):
            calls.update(make_calls(who, paths[who], context))
        medians = {pair: interleaved({"a": calls[pair[0]], "b": calls[pair[1]]}, args.blocks)
                   for pair in pairs}
        rounds.append({pair: (m["a"], m["b"]) for pair, m in medians.items()})
    return rounds


def pair_times(rounds: list[dict], a, b) -> tuple[float, float, list[float]]:
    """Median over rounds of a's and b's seconds per call, and the per-round ratios a / b."""
    times = [r[a, b] for r in rounds]
    return (statistics.median(t[0] for t in times), statistics.median(t[1] for t in times),
            [t[0] / t[1] for t in times])


def pair_difference(rounds: list[dict], a, b) -> float:
    """Median over rounds of a's minus b's seconds per call, each round's pair timed together
    (the difference of the two medians would mix rounds run at different machine speeds)."""
    return statistics.median(r[a, b][0] - r[a, b][1] for r in rounds)


def layer_pairs() -> list:
    return [(("psa", layer), ("twin", layer)) for layer in LAYERS]


def session_layers(who: str, path: Path, context: np.ndarray) -> dict:
    layers, _ = layer_calls(path, context)
    return {(who, layer): c for layer, c in layers.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m"])
    parser.add_argument("--context", type=int, default=64, help="P: tokens before the step "
                        "(docs/benchmarks.md's mean decode context at -n 128)")
    parser.add_argument("--rounds", type=int, default=16, help="Fresh sessions per cell.")
    parser.add_argument("--blocks", type=int, default=40, help="A B / B A blocks per round.")
    args = parser.parse_args()
    started, cpu_before = time.time(), cpu_times()
    rows, profiles, nodes = [], {}, {}
    for preset in args.presets:
        ckpt = checkpoint(preset)
        context = task_context(ckpt, args.context)
        for target, quant in BUILDS:
            paths = {who: artifact(ckpt, target, quant, who == "twin") for who in ("psa", "twin")}
            set_threads(list(paths.values()), 1)
            rounds = rounds_of(paths, context, args, session_layers, layer_pairs())
            rows.append((preset, target, quant or "fp32", rounds))
            ratio = geomean(pair_times(rounds, ("psa", LAYERS[0]), ("twin", LAYERS[0]))[2])
            print(f"{preset} {target} {quant or 'fp32'}: backend call ratio {ratio:.3f}",
                  flush=True)
            if target == "onnx":
                nodes[(preset, quant or "fp32")] = tuple(node_count(p) for p in paths.values())
                feeds = {who: layer_calls(path, context)[1] for who, path in paths.items()}
                profiles[(preset, quant or "fp32")] = tuple(
                    ort_kernel_profiles(paths, feeds, args.blocks).values())
    # The first preset: every graph form; the others: the two candidate fixes.
    decode_only = [decode_only_experiment(args, preset, FORMS if i == 0 else FORMS[:3])
                   for i, preset in enumerate(args.presets)]
    floors = {preset: floor_of(preset, rows, args) for preset in args.presets}
    reattach = reattach_experiment(args)
    expand = expand_experiment(args)
    splits = split_experiment(args)
    write(rows, profiles, nodes, decode_only, floors, reattach, expand, splits, args,
          (time.time() - started, steal_share(cpu_before, cpu_times())))


def floor_of(preset: str, rows, args) -> dict:
    """What the per-layer pieces PSA adds cost in ONNX Runtime in isolation, summed over the
    preset's layers, against its measured ONNX fp32 backend-call overhead."""
    cfg = json.loads(Path(f"{checkpoint(preset)}.json").read_text())["config"]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    units = unit_costs((1, cfg["num_key_value_heads"], 1, head_dim), args.blocks)
    rounds = next(r for p, t, q, r in rows if (p, t, q) == (preset, "onnx", "fp32"))
    cells = ("psa", LAYERS[0]), ("twin", LAYERS[0])
    _, twin, ratios = pair_times(rounds, *cells)
    return {"layers": cfg["num_hidden_layers"], "units": units, "twin": twin,
            "measured": geomean(ratios), "measured_us": pair_difference(rounds, *cells) * 1e6}


def floor_table(floors: dict) -> str:
    lines = ["| preset | layers | " + " | ".join(f"{u} (µs per layer)" for u in UNITS) +
             " | sum over layers (µs) | predicted ratio (twin call + sum) | without the shift "
             "(S = 1 graph) | measured ratio (table above) |", "|" + "---|" * (6 + len(UNITS))]
    for preset, f in floors.items():
        total = f["layers"] * sum(f["units"].values())
        without_shift = total - f["layers"] * f["units"][UNITS[1]]
        lines.append(f"| {preset} | {f['layers']} | " + " | ".join(
            f"{f['units'][u] * 1e6:.2f}" for u in UNITS) + f" | {total * 1e6:.1f} | "
            f"{1 + total / f['twin']:.3f} | {1 + without_shift / f['twin']:.3f} | "
            f"{f['measured']:.3f} ({f['measured_us']:+.1f} µs) |")
    return "\n".join(lines)


def task_context(ckpt: Path, length: int) -> np.ndarray:
    vocab = json.loads(Path(f"{ckpt}.json").read_text())["config"]["vocab_size"]
    return np.random.default_rng(0).integers(0, vocab, length)


def patched_export(ckpt: Path, target: str, quant: str | None, label: str, name: str,
                   replacement, twin: bool = False) -> Path:
    """A PSA build (or its twin) exported with the object at dotted `name` replaced (a variant
    for a comparison, not a shipped artifact), cached in out/bench/ under `label`."""
    from unittest import mock

    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.export.quantize import QuantSpec
    from psa_edge.io import sha256_file

    suffix = ".onnx" if target == "onnx" else ".pte"
    label += ".twin" if twin else ""
    path = OUT / f"{ckpt.stem}.{target}.{quant or 'fp32'}.{label}{suffix}"
    if not up_to_date(Path(f"{path}.json"), sha256_file(ckpt)):
        with mock.patch(name, replacement):
            run_export(ExportRequest(ckpt, target, path, MAX_LEN, twin=twin,
                                     quant=QuantSpec(quant) if quant else None))
    return path


def unreattached_int8(ckpt: Path) -> Path:
    """The XNNPACK int8 PSA program as exported before `quantize.reattach_shifts`: its
    `decode` method keeps the converted graph's static cat/slice."""
    return patched_export(ckpt, "xnnpack", "int8", "unreattached",
                          "psa_edge.export.quantize.reattach_shifts", lambda module: 0)


def backend_call(who, path: Path, context: np.ndarray) -> dict:
    """The backend-call cell of one artifact, for `rounds_of`."""
    return {who: layer_calls(path, context)[0][LAYERS[0]]}


def reattach_experiment(args) -> list[dict]:
    """Backend-call rounds of psa-4m's XNNPACK int8 `decode`: shipped PSA, the same program
    without the reattached shift, and the twin."""
    ckpt = checkpoint("psa-4m")
    paths = {"shipped": artifact(ckpt, "xnnpack", "int8", False),
             "unreattached": unreattached_int8(ckpt),
             "twin": artifact(ckpt, "xnnpack", "int8", True)}
    set_threads(list(paths.values()), 1)
    return rounds_of(paths, task_context(ckpt, args.context), args, backend_call,
                     [("unreattached", "twin"), ("shipped", "twin")])


def reattach_table(rounds: list[dict]) -> str:
    lines = ["| psa-4m XNNPACK int8 `decode` | backend call ms | ratio to twin [95% CI] |",
             "|---|---|---|"]
    for who in ("unreattached", "shipped"):
        ms, twin_ms, ratios = pair_times(rounds, who, "twin")
        lines.append(f"| {who} | {ms * 1e3:.4f} | {ratio_text(ratios)} |")
    lines.append(f"| twin | {twin_ms * 1e3:.4f} | 1 |")
    return "\n".join(lines)


def with_expand_copies(ckpt: Path, quant: str | None, twin: bool) -> Path:
    """The XNNPACK build lowered without XNNPACK's edge transforms, as psa-edge lowered until
    2026-12-03: the identity expand_copy nodes of attention's matmuls stay, outside the
    delegate."""
    return patched_export(ckpt, "xnnpack", quant, "expand-copies",
                          "executorch.backends.xnnpack.utils.configs.get_transform_passes",
                          lambda: None, twin=twin)


EXPAND_PAIRS = ((("shipped", "twin"), ("copies", "twin")),
                (("shipped", "psa"), ("copies", "psa")),
                (("shipped", "psa"), ("shipped", "twin")),
                (("copies", "psa"), ("copies", "twin")))


def expand_experiment(args) -> dict:
    """Per XNNPACK build of psa-4m: backend-call rounds of the shipped PSA and twin programs
    against the same programs with the expand copies left in (EXPAND_PAIRS), and how many
    expand_copy ops each `decode` left outside the delegate."""
    ckpt = checkpoint("psa-4m")
    context = task_context(ckpt, args.context)
    results = {}
    for quant in (q for target, q in BUILDS if target == "xnnpack"):
        paths = {("shipped", who): artifact(ckpt, "xnnpack", quant, who == "twin")
                 for who in ("psa", "twin")}
        paths.update((("copies", who), with_expand_copies(ckpt, quant, who == "twin"))
                     for who in ("psa", "twin"))
        set_threads(list(paths.values()), 1)
        copies = {key: json.loads(Path(f"{path}.json").read_text())["delegation"]["methods"]
                  ["decode"]["ops_outside_delegate"].get("aten_expand_copy_default", {})
                  .get("count", 0) for key, path in paths.items()}
        results[quant or "fp32"] = {"copies": copies, "rounds": rounds_of(
            paths, context, args, backend_call, list(EXPAND_PAIRS))}
    return results


def expand_table(results: dict) -> str:
    lines = ["| psa-4m XNNPACK `decode` | expand_copy outside the delegate: with the copies / "
             "shipped | backend call µs: with the copies | shipped | shipped / with the copies "
             "[95% CI] |", "|---|---|---|---|---|"]
    for precision, r in results.items():
        for who, pair in zip(("PSA", "twin"), (EXPAND_PAIRS[1], EXPAND_PAIRS[0])):
            shipped, copies, ratios = pair_times(r["rounds"], *pair)
            lines.append(f"| {precision} {who} | {r['copies'][pair[1]]} / "
                         f"{r['copies'][pair[0]]} | {copies * 1e6:.1f} | {shipped * 1e6:.1f} | "
                         f"{ratio_text(ratios)} |")
    lines.append("\nPSA / twin, each pair timed together: " + "; ".join(
        f"{precision} with the copies {ratio_text(pair_times(r['rounds'], *EXPAND_PAIRS[3])[2])}"
        f", shipped {ratio_text(pair_times(r['rounds'], *EXPAND_PAIRS[2])[2])}"
        for precision, r in results.items()) + ".")
    return "\n".join(lines)


def bypassed_shear(ckpt: Path, target: str, quant: str | None) -> Path:
    """The PSA build with the shear's arithmetic and shift bypassed (the cache gets the raw
    keys) and its I/O kept: the previous-key slot inputs and the stacked raw-key output. Its
    outputs are not PSA's: it exists to split PSA's overhead."""
    return patched_export(ckpt, target, quant, "bypassed", "psa_edge.model.transformer.shear",
                          lambda x, prev, gamma: x)


SPLIT = (("psa", "twin"), ("bypassed", "twin"), ("psa", "bypassed"))


def split_experiment(args) -> dict:
    """Per preset and build, backend-call rounds of PSA, PSA with the shear bypassed (I/O
    kept) and the twin: PSA / twin = (bypassed / twin: the slot I/O) x (PSA / bypassed: the
    shear's ops)."""
    splits = {}
    for preset, (target, quant) in itertools.product(args.presets, BUILDS):
        ckpt = checkpoint(preset)
        context = task_context(ckpt, args.context)
        paths = {"psa": artifact(ckpt, target, quant, False),
                 "bypassed": bypassed_shear(ckpt, target, quant),
                 "twin": artifact(ckpt, target, quant, True)}
        set_threads(list(paths.values()), 1)
        splits[(preset, target, quant or "fp32")] = rounds_of(paths, context, args,
                                                              backend_call, list(SPLIT))
    return splits


def split_table(splits: dict) -> str:
    lines = ["| preset | build | PSA / twin | bypassed / twin: slot I/O | PSA / bypassed: the "
             "shear's ops | slot I/O (µs) | the shear's ops (µs) |", "|" + "---|" * 7]
    for (preset, target, precision), rounds in splits.items():
        cells = [ratio_text(pair_times(rounds, *pair)[2]) for pair in SPLIT]
        micros = [f"{pair_difference(rounds, *pair) * 1e6:+.1f}" for pair in SPLIT[1:]]
        lines.append(f"| {preset} | {target} {precision} | " + " | ".join(cells + micros)
                     + " |")
    return "\n".join(lines)


def decode_only_experiment(args, preset: str, forms: tuple[str, ...]) -> dict:
    """Backend-call rounds of a preset's shipped (dynamic) ONNX fp32 graphs against the other
    `forms` (FORMS), PSA and twin, with an A/A control; and what the decode-only graph would
    cost to ship beside the shipped one."""
    ckpt = checkpoint(preset)
    context = task_context(ckpt, args.context)
    shipped = {who: artifact(ckpt, "onnx", None, who == "twin") for who in ("psa", "twin")}
    feeds = {who: layer_calls(path, context)[1] for who, path in shipped.items()}
    makers = {"decode-only": decode_only_onnx, "legacy I/O": legacy_io_onnx,
              "merged": merged_onnx}
    paths = {("dynamic", who): path for who, path in shipped.items()}
    paths.update({(kind, who): makers[kind](ckpt, who == "twin")
                  for kind in forms if kind != "dynamic" for who in ("psa", "twin")})
    # A/A control: the twin against a byte-identical copy, the resolution of this procedure.
    paths[("copy", "twin")] = OUT / f"aa-copy.{preset}.onnx"
    shutil.copyfile(shipped["twin"], paths[("copy", "twin")])
    paths[("copy", "reference")] = shipped["twin"]

    def ort_call(key, path, _context):
        session = ort_session(path)
        feed = feeds["psa" if key[1] == "psa" else "twin"]
        return {key: (lambda: session.run(None, feed), None)}

    pairs = [((kind, "psa"), (kind, "twin")) for kind in forms]
    if "merged" in forms:
        pairs += [(("merged", "twin"), ("dynamic", "twin"))]  # what the If costs the twin
    rounds = rounds_of(paths, context, args, ort_call,
                       pairs + [(("copy", "twin"), ("copy", "reference"))])
    return {"preset": preset, "forms": forms, "rounds": rounds,
            "nodes": {key: node_count(path) for key, path in paths.items()},
            "memory": memory_costs(paths, feeds["psa"])}


def memory_costs(paths: dict, feeds: dict) -> dict:
    """What each way of shipping the decode-only graph costs, PSA fp32: file bytes, and the
    resident memory of the sessions after a one-token step, each measured in a fresh process
    (this one has freed memory to reuse, which would hide growth): the shipped graph alone,
    what the decode-only graph's session adds beside it (a second file with its own copy of the
    weights; one-token steps on it, chunks on the other), and the merged graph alone (when
    measured)."""
    def resident(*graphs: Path) -> list[int]:
        """The resident memory each graph's session adds, opened in turn in one process."""
        return [int(v) for v in in_fresh_process(["-c", OPEN_SESSIONS], feeds, *graphs).split()]

    shipped, decode = paths[("dynamic", "psa")], paths[("decode-only", "psa")]
    costs = dict(zip(("dynamic", "decode-only"), resident(shipped, decode)))
    if ("merged", "psa") in paths:
        costs["merged"] = resident(paths[("merged", "psa")])[0]
    return {kind: {"file_bytes": paths[(kind, "psa")].stat().st_size, "rss_bytes": rss}
            for kind, rss in costs.items()}


def in_fresh_process(program: list[str], feeds: dict, *args) -> str:
    """The stdout of `python PROGRAM FEEDS.npz ARGS...` in a fresh process (this one has freed
    memory to reuse, which would hide growth), FEEDS.npz holding `feeds`."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "feeds.npz", **feeds)
        return subprocess.run([sys.executable, *program, str(Path(tmp) / "feeds.npz"),
                               *map(str, args)], capture_output=True, text=True, check=True,
                              cwd=REPO).stdout


# Run in a fresh process by `memory_costs`: argv = feeds (.npz), then the graphs to open in
# turn; prints the resident memory each adds once it has run a step. It sets a session up as
# `ort_session` does, without importing this module: the measured process holds only numpy and
# onnxruntime (importing the tools' modules added about 3 MB to the first reading).
OPEN_SESSIONS = """
import sys
import numpy as np
import onnxruntime as ort
from psa_edge.runtime.bench import rss_bytes
feeds = dict(np.load(sys.argv[1]))
sessions, grown = [], []
for path in sys.argv[2:]:
    before = rss_bytes()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sessions.append(ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]))
    sessions[-1].run(None, feeds)
    grown.append(rss_bytes() - before)
print(*grown)
"""


def reading(rows, profiles, nodes, decode_only, floors, splits) -> str:
    """The measured facts the tables support, computed from them."""
    def ratio_range(rounds, key_a, key_b):
        return interval(pair_times(rounds, key_a, key_b)[2])

    lines = ["", "## Reading it", ""]
    for preset, target, precision, rounds in rows:
        mean, low, high = ratio_range(rounds, ("psa", LAYERS[0]), ("twin", LAYERS[0]))
        verdict = {"above": "PSA slower (the interval is above 1)",
                   "below": "PSA faster (the interval is below 1)",
                   "across": "not resolved (the interval contains 1)"}[side_of_one(low, high)]
        count = nodes.get((preset, precision)) if target == "onnx" else None
        twin_ms = pair_times(rounds, ("psa", LAYERS[0]), ("twin", LAYERS[0]))[1]
        lines.append(f"- {preset} {target} {precision}: backend call {mean:.3f} "
                     f"[{low:.3f}, {high:.3f}], {verdict}" + (
                         f"; ONNX nodes PSA / twin {count[0]} / {count[1]} = "
                         f"{count[0] / count[1]:.3f}, the twin's call is "
                         f"{twin_ms * 1e6 / count[1]:.2f} µs per node." if count else "."))
    for (preset, precision), (psa, twin) in profiles.items():
        only = sorted(op for op in psa if op not in twin and not op.startswith("("))
        own = sum(psa[op] for op in only)
        shared = psa.get("MatMul", 0.0) - twin.get("MatMul", 0.0)
        lines.append(f"- {preset} ONNX {precision}, profiler: the operator types only PSA has "
                     f"({', '.join(only)}) take {own:.1f} µs per call; MatMul, the same work in "
                     f"both graphs, differs by {shared:+.1f} µs; all kernels by "
                     f"{psa['(all kernels)'] - twin['(all kernels)']:+.1f} µs.")
    for experiment in decode_only:
        lines += forms_reading(experiment)
    for preset, f in floors.items():
        pieces = f["layers"] * sum(f["units"].values()) * 1e6
        rest = ("the graphs differ by those nodes only (benchmarks.md lists them), so the rest "
                "is how they run inside the model (caches, memory plan) or noise (A/A)"
                if pieces < f["measured_us"] else "they account for all of it")
        lines.append(f"- {preset} ONNX fp32: the pieces PSA adds cost {pieces:.1f} µs per token "
                     f"in isolation, of the {f['measured_us']:+.1f} µs measured; {rest}.")
    for (preset, target, precision), rounds in splits.items():
        io, ops = (pair_times(rounds, *pair)[2] for pair in SPLIT[1:])
        lines.append(f"- {preset} {target} {precision}: the slot I/O {ratio_text(io)}, the "
                     f"shear's ops {ratio_text(ops)}; " + (
                         f"the ops alone are above the {GOAL} goal." if interval(ops)[1] > GOAL
                         else f"the ops alone are not shown above the {GOAL} goal."))
    return "\n".join(lines) + "\n"


def forms_table(experiments: list[dict]) -> str:
    lines = ["| preset | ONNX fp32 graph | nodes PSA / twin | backend call PSA ms | twin ms | "
             "ratio [95% CI] |", "|---|---|---|---|---|---|"]
    for e in experiments:
        for kind in e["forms"]:
            a, b, ratios = pair_times(e["rounds"], (kind, "psa"), (kind, "twin"))
            # The merged graph's nodes are the two graphs above, inside its If's branches.
            counts = ("an If over the two above" if kind == "merged" else
                      f"{e['nodes'][(kind, 'psa')]} / {e['nodes'][(kind, 'twin')]}")
            lines.append(f"| {e['preset']} | {kind} | {counts} | {a * 1e3:.4f} | "
                         f"{b * 1e3:.4f} | {ratio_text(ratios)} |")
    return "\n".join(lines)


def shipping_table(experiments: list[dict]) -> str:
    lines = ["| preset | shipped graph: file (MB) | its session (MB) | decode-only graph: file "
             "(MB) | its session added (MB) | merged graph: file (MB) | its session (MB) |",
             "|---|---|---|---|---|---|---|"]
    for e in experiments:
        cells = [f"{e['memory'][kind][field] / 1e6:.1f}" if kind in e["memory"] else "-"
                 for kind in ("dynamic", "decode-only", "merged")
                 for field in ("file_bytes", "rss_bytes")]
        lines.append(f"| {e['preset']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def forms_reading(experiment: dict) -> list[str]:
    """The reading of one preset's graph forms: each against the shipped dynamic graph."""
    preset, rounds = experiment["preset"], experiment["rounds"]

    def psa_over_twin(kind: str) -> list[float]:
        return pair_times(rounds, (kind, "psa"), (kind, "twin"))[2]

    dynamic = ratio_text(psa_over_twin("dynamic"))
    control = pair_times(rounds, ("copy", "twin"), ("copy", "reference"))[2]
    low, high = geomean_ci(control)["ci95"]
    off = "" if low <= 1 <= high else (", whose interval excludes 1: in this run the procedure "
                                       "itself errs by that much")
    decode = psa_over_twin("decode-only")
    lines = [f"- Decode-only ONNX graph ({preset} fp32): ratio {ratio_text(decode)} (goal "
             f"{GOAL}: {verdict_of(decode)}), against {dynamic} "
             f"for the shipped dynamic graph in the same rounds; A/A control of the backend call "
             f"(the twin against a copy of its file, same rounds): {ratio_text(control)}{off}."]
    if "merged" in experiment["forms"]:
        if_cost = pair_times(rounds, ("merged", "twin"), ("dynamic", "twin"))[2]
        lines.append(f"- Merged ({preset} fp32): PSA / twin {ratio_text(psa_over_twin('merged'))}"
                     f"; the merged twin against the shipped twin {ratio_text(if_cost)}, what "
                     f"the `If` costs a decode step.")
    if "legacy I/O" in experiment["forms"]:
        lines.append(f"- Legacy I/O ({preset} fp32): with the outputs shipped before 2026-12-03 "
                     f"the PSA / twin ratio reads {ratio_text(psa_over_twin('legacy I/O'))} "
                     f"against {dynamic} for the shipped pair.")
    memory = {kind: cost["rss_bytes"] / 1e6 for kind, cost in experiment["memory"].items()}
    base = memory["dynamic"]
    lines.append(f"- What shipping the decode-only graph would cost ({preset} fp32, resident "
                 f"memory): as a second file, its session adds {memory['decode-only']:.0f} MB to "
                 f"the shipped session's {base:.0f} MB (+{memory['decode-only'] / base:.0%})" + (
                     f"; merged, the session holds {memory['merged']:.0f} MB "
                     f"({memory['merged'] / base - 1:+.0%}), the weights stored once in the "
                     f"file." if "merged" in memory else "."))
    return lines


def write(rows, profiles, nodes, decode_only, floors, reattach, expand, splits, args, run
          ) -> None:
    (wall, steal), m = run, machine()
    doc = f"""# Where PSA's decode overhead comes from

Made by `python tools/decode_profile.py --context {args.context} --rounds {args.rounds} \
--blocks {args.blocks}` in {wall / 60:.0f} min on {m['cpu']} ({m['cores']} cores, {m['arch']};
{steal_sentence(steal)}), one thread, with the artifacts of [benchmarks.md](benchmarks.md) (random weights, key-only
gamma_k 0.8). One decode step at a fixed context of {args.context} tokens (state restored before
every call). Three nested layers: the backend call alone (ONNX Runtime `run` / ExecuTorch
`Method.execute` of method `decode`, on prebuilt inputs), psa-edge's `graph.step` around it
(numpy feeds in, outputs out) and the whole `Session.feed`. Each of {args.rounds} rounds opens
fresh sessions, PSA first in even rounds and the twin first in odd ones, and times each layer's
PSA and twin on their own, alternating in {args.blocks} blocks (A B / B A) of turns of about
{BLOCK_SECONDS * 1e3:.0f} ms; times are the median over rounds of each round's median, ratios the
geometric mean of the rounds' ratios with its 95% confidence interval. An interval that
contains 1 means the difference is below what this procedure resolves on this machine.
ExecuTorch's ETDump (time per instruction inside a `.pte`) needs a runtime built with its event
tracer (`EXECUTORCH_ENABLE_EVENT_TRACER`); the executorch 1.4.1 wheel answers "No etdump data
found", so the XNNPACK rows are split by layer here, by delegate calls in benchmarks.md and
by function, from Linux perf's samples, in [xnnpack-profile.md](xnnpack-profile.md).

{layers_table(rows)}

## The overhead split: slot I/O and the shear's ops

PSA's decode graph differs from its twin's in two things: its I/O (a previous-key slot input
per layer, one stacked raw-key output) and the shear's ops (Sub, Mul, Add per layer and, in
ONNX's dynamic-length graph, the shift's Concat and Slice and the Transposes ONNX Runtime adds
around them). "bypassed" is the PSA
artifact exported again with the shear replaced by the identity and its I/O kept, so
PSA / twin = (bypassed / twin: the I/O) x (PSA / bypassed: the ops). This splits the XNNPACK
rows, which ETDump cannot here. Bypassed, the slot inputs have no consumer: the runtimes still
take them in every call, but no kernel or delegate reads them, so the I/O column is a lower
bound and the ops column an upper bound. Backend call, each pair timed alone like the table
above:

{split_table(splits)}

## ONNX Runtime's profile of one decode call

Kernel time per operator type, mean over {args.blocks * 25} calls per artifact with ORT's
profiler on (PSA and twin alternating in blocks of 25; the profiler adds its own cost per node,
so totals are above the medians above):
{profile_table(profiles)}

## Other forms of the ONNX graph

The shipped ONNX graph has a dynamic chunk length, so the shear's shift is a Concat and a Slice
per layer beside its Sub/Mul/Add. Exported again with the chunk length fixed at 1 (what
ExecuTorch's `decode` method is; "decode-only"), the PSA graph needs only the Sub/Mul/Add.
"legacy I/O" is the graph pair with the outputs psa-edge shipped until 2026-12-03: PSA
returned each slot (`present.{{i}}.prev_key`, now read from the last row of the raw keys) and
one raw-key output per layer (`present.{{i}}.raw_key`, now one output, `present.raw_key`, with
the layers stacked), and the twin returned raw keys it never needs (now gone: the twin's I/O is
a plain Llama decoder's). "merged" puts the dynamic and the decode-only graph in one file
behind an `If` on the chunk length, the weights stored once (as Hugging Face Optimum merges its
decoders), which is how the decode-only graph could ship without a second copy of the weights.
Backend call at the same context, measured like the table above (psa-4m in every form, the
other presets in the two forms that could fix the shift's cost; fp32 only: an int8 decode-only graph
would need its own calibration, which psa-edge's ONNX quantization does not do):

{forms_table(decode_only)}

What each form would cost to ship, PSA fp32: file size and resident memory after a one-token
step, each measured in a fresh process. The decode-only graph would ship as a second file with
its own copy of the weights, its session opened beside the shipped one's (one-token steps on it,
chunks on the other), so the table gives what its session adds; the merged graph replaces the
shipped one:

{shipping_table(decode_only)}
"""
    doc += f"""
## What the pieces cost in isolation (ONNX Runtime, one thread)

Each piece PSA adds per layer to the twin's decode graph, timed alone on the slot's shape
`[1, Hkv, 1, dh]`: a graph with 24 copies against one with none, interleaved, so the call's
fixed cost cancels. The sum over the layers, added to the twin's measured backend call, is the
overhead these pieces explain (without the one stacked raw-key output per call, a fixed cost
the slope leaves out); the last columns compare it with what was measured.

{floor_table(floors)}
"""
    doc += f"""
## XNNPACK int8: the shift reattached before re-tracing `decode`

An int8 program's methods are re-traced from one quantized graph, in which the shear's shift
had become plain cat/slice ops; re-traced at S = 1 they stayed, as static ops inside XNNPACK.
`quantize.reattach_shifts` turns them back into `ops.previous` first, so `decode` needs no op
for them, as in fp32. The same psa-4m program exported without that step,
against the shipped one and the twin (backend call, measured like the first table):

{reattach_table(reattach)}

## XNNPACK: attention's expand copies, removed from every program

`aten.matmul` on 4-D operands decomposes into expand, view and bmm. The expands of attention's
two matmuls (`query @ keys^T`, `weights @ values`) change no shape, but XNNPACK does not take
expand_copy, so each ran outside the delegate in ExecuTorch's portable kernel: a copy of a
layer's whole key or value cache on every step. psa-edge now lowers with XNNPACK's edge transforms
(`executorch.backends.xnnpack.utils.configs.get_transform_passes`, as ExecuTorch's XNNPACK
recipe does), which remove such no-op expands before partitioning. The psa-4m programs lowered
without them, against the shipped ones (backend call, each pair timed like the first table):

{expand_table(expand)}

The copies are of the same caches in PSA and its twin, so removing them speeds up both; PSA's
own extra per step stays, a larger share of a shorter step. Whether its ratio to the twin moved
is in the intervals of the line above (each ratio from its own pairs of turns).
"""
    doc += reading(rows, profiles, nodes, decode_only, floors, splits)
    write_text(REPO / "docs" / "decode-profile.md", doc)
    print(doc)


if __name__ == "__main__":
    main()
