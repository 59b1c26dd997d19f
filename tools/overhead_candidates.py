"""docs/overhead-candidates.md: four changes that could shrink PSA's decode overhead over its
gamma = 0 twin, each built, checked to compute the same numbers and timed; none is shipped.

    python tools/overhead_candidates.py   # about 10 minutes (candidate builds included);
                                          # reuses tools/bench_presets.py's artifacts in
                                          # out/bench/ (exports them if missing)

The candidates, each a psa-4m (ONNX: and psa-30m) build of docs/benchmarks.md with one change:
- "stacked slot" (XNNPACK fp32): the previous-key slots enter as one input `[layers, Hkv, 1, dh]`
  (what the stacked raw-key output of the step before already is) instead of one per layer, so
  a step passes PSA's slot state in one tensor (fp32 only: the int8 flow re-traces psa-edge's
  own graph form);
- "4-D mean" (XNNPACK fp32 and int8, PSA and twin): RMSNorm's mean over the hidden dim written
  as a mean over dims (2, 3) of a 4-D view, which XNNPACK takes (global average pooling), so
  `decode` has fewer delegate calls;
- "ORT layout" (ONNX fp32): ONNX Runtime's transpose optimizer computes the keys in
  `[.., S, H, dh]` and adds a Transpose per slot input and one on the raw-key output; this graph
  states that layout itself (each slot reshaped to `[1, 1, Hkv, dh]` and transposed, the raw
  keys returned as `[layers, S, Hkv, dh]`) so the optimizer cancels those Transposes;
- "shared decode-only" (ONNX fp32, PSA and twin): decode-profile.md's decode-only graph (chunk
  length 1, no shift ops) run for one-token steps in a second session beside the shipped
  graph's, the two sessions holding one copy of the weights (`SessionOptions.add_initializer`
  with the same OrtValues; prepacking off, as a session would otherwise pack its own copy):
  decode step, prefill and resident memory against the shipped session alone.
Each candidate's numbers are checked against the shipped build on the same inputs (max abs
logit difference). Timing is tools/decode_profile.py's backend call of one decode step at a
fixed context, on prebuilt inputs: rounds of freshly opened programs, the load order alternating,
each pair timed alone in paired turns of about 4 ms, ratios as geometric means of the rounds'
ratios with their 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import decode_profile as dp  # noqa: E402
from bench_presets import (GOAL, OUT, REPO, artifact, checkpoint, cpu_times,  # noqa: E402
                           ort_node_types, ratio_text, steal_sentence, steal_share, verdict_of)
from psa_edge.export.graphs import ExplicitStateGraph  # noqa: E402
from psa_edge.io import write_text  # noqa: E402
from psa_edge.runtime.bench import machine  # noqa: E402
from shared_weights import open_shared  # noqa: E402

DOC = REPO / "docs" / "overhead-candidates.md"
PAIRS = [("candidate", "twin"), ("psa", "twin"), ("candidate", "psa")]
MEMORY_MODES = ("alone", "shared", "shared-prepacked")  # tools/shared_weights.py's


class StackedSlotGraph(ExplicitStateGraph):
    """`(input_ids, key_0, value_0, ..., prev_key [layers, Hkv, 1, dh])`: the shipped graph
    with the per-layer slot inputs replaced by one stacked input."""

    def forward(self, input_ids, *inputs):
        *caches, slots = inputs
        past = []
        for i in range(self.model.cfg.num_hidden_layers):
            past += [caches[2 * i], caches[2 * i + 1], slots[i:i + 1]]
        return super().forward(input_ids, *past)


class OrtLayoutGraph(ExplicitStateGraph):
    """The shipped graph with its slots and raw keys in the `[.., S, H, dh]` layout ONNX
    Runtime's transpose optimizer computes keys in (the same values)."""

    def layer_states(self, past):
        states = super().layer_states(past)
        for state in states:
            slot = state["prev_key"]
            state["prev_key"] = slot.reshape(1, 1, slot.shape[1], slot.shape[3]).transpose(1, 2)
        return states

    def forward(self, input_ids, *past):
        logits, new_state, raws = self.model.forward_with_state(input_ids, self.layer_states(past))
        caches = [layer[f] for layer in new_state for f in ("key", "value")]
        return (logits, *caches, torch.cat([raw["key"].transpose(1, 2) for raw in raws]))


def rms_norm_4d(x, weight, eps):
    """RMSNorm with its mean as XNNPACK's global average pooling: dims (2, 3) of a 4-D view."""
    shape = x.shape
    variance = x.pow(2).reshape(*shape, 1).mean((2, 3), keepdim=True).reshape(*shape[:-1], 1)
    return x * torch.rsqrt(variance + eps) * weight


def stacked_slot_pte(ckpt: Path) -> Path:
    """psa-4m's XNNPACK fp32 program (`forward` and `decode`) with one stacked slot input,
    built afresh on every run (it has no manifest to tell a stale build by)."""
    from psa_edge.export import executorch_target as et
    from psa_edge.export.graphs import dynamic_shapes, example_inputs
    from psa_edge.model.checkpoint import load_checkpoint

    path = OUT / f"{ckpt.stem}.xnnpack.fp32.stacked-slot.pte"
    model = load_checkpoint(ckpt)[0].float().eval()
    cfg, graph, methods = model.cfg, StackedSlotGraph(model).eval(), {}
    for name, seq_len in (("forward", 3), ("decode", 1)):
        ids, *state = example_inputs(cfg, seq_len, 4)
        seq, state_shapes = dynamic_shapes(cfg, dp.MAX_LEN, decode=name == "decode")
        caches = [t for t, s in zip(state, state_shapes) if s is not None]
        slots = torch.cat([t for t, s in zip(state, state_shapes) if s is None])
        shapes = (seq, (*(s for s in state_shapes if s is not None), None))
        methods[name] = et.export_program(graph, (ids, *caches, slots), shapes)
    dp.write_bytes(path, et.lower_pte(methods, "xnnpack")[0])
    return path


def ort_layout_onnx(ckpt: Path) -> Path:
    from psa_edge.export.onnx_target import export_onnx_program, serialize_onnx
    from psa_edge.model.checkpoint import load_checkpoint

    path = OUT / f"{ckpt.stem}.onnx.fp32.ort-layout.onnx"
    model = load_checkpoint(ckpt)[0].float().eval()
    program = export_onnx_program(model, dp.MAX_LEN, graph=OrtLayoutGraph(model))
    dp.write_bytes(path, serialize_onnx(program.model_proto))
    return path


def shipped_feeds(ckpt: Path, target: str, context: np.ndarray) -> dict:
    """The inputs of the shipped PSA build's decode step at this context."""
    return dp.layer_calls(artifact(ckpt, target, None, False), context)[1]


def stacked_call(path: Path, feeds: dict):
    """(call, setup) of the stacked-slot program's `decode` on the shipped step's inputs, and
    its logits."""
    from psa_edge.executorch_backend import as_torch, load_methods

    names = [n for n in feeds if not n.endswith("prev_key")]
    slots = np.concatenate([feeds[n] for n in feeds if n.endswith("prev_key")])
    args = [as_torch(feeds[n]) for n in names] + [as_torch(slots)]
    method = load_methods(path, ("decode",))["decode"]
    return (lambda: method.execute(args), None), method.execute(args)[0].numpy()


def ort_call(path: Path, feeds: dict):
    session = dp.ort_session(path)
    return (lambda: session.run(None, feeds), None), session.run(["logits"], feeds)[0]


def shipped_logits(path: Path, feeds: dict) -> np.ndarray:
    from psa_edge.runtime.graph import open_graph

    return open_graph(path, threads=1).run(feeds)["logits"]


def measure(paths: dict, context, args, candidate_call=None) -> list[tuple]:
    """(a, b, a's time, b's time, ratios) per pair, from backend-call rounds over `paths`;
    `candidate_call(path)` builds the call of an artifact the runtime cannot open (other I/O
    than the exporter writes)."""
    def calls(who, path, ctx):
        if candidate_call and who.startswith("candidate"):
            return {who: candidate_call(path)[0]}
        return dp.backend_call(who, path, ctx)

    dp.set_threads([p for w, p in paths.items()
                    if not (candidate_call and w.startswith("candidate"))], 1)
    pairs = [pair for pair in PAIRS + [("candidate.twin", "twin"), ("candidate", "candidate.twin")]
             if all(who in paths for who in pair)]
    rounds = dp.rounds_of(paths, context, args, calls, pairs)
    return [(a, b, *dp.pair_times(rounds, a, b)) for a, b in pairs]


def delegate_calls(path: Path) -> str:
    delegation = json.loads(Path(f"{path}.json").read_text())["delegation"]
    decode = delegation["methods"]["decode"]
    return f"{delegation['delegated_subgraphs']} / {decode['delegated_subgraphs']}"


def stacked_experiment(args) -> dict:
    ckpt = checkpoint("psa-4m")
    context = dp.task_context(ckpt, args.context)
    path, feeds = stacked_slot_pte(ckpt), shipped_feeds(ckpt, "xnnpack", context)
    paths = {"psa": artifact(ckpt, "xnnpack", None, False), "candidate": path,
             "twin": artifact(ckpt, "xnnpack", None, True)}
    diff = np.abs(stacked_call(path, feeds)[1] - shipped_logits(paths["psa"], feeds)).max()
    slots = sum(name.endswith("prev_key") for name in feeds)
    return {"rows": measure(paths, context, args, lambda p: stacked_call(p, feeds)),
            "diff": float(diff), "psa_inputs": len(feeds), "inputs": len(feeds) - slots + 1}


def mean_4d_experiment(args, quant: str | None) -> dict:
    ckpt = checkpoint("psa-4m")
    paths = {"psa": artifact(ckpt, "xnnpack", quant, False),
             "twin": artifact(ckpt, "xnnpack", quant, True)}
    for twin in (False, True):  # the exporter's parity probe checks each against eager fp32
        paths["candidate.twin" if twin else "candidate"] = dp.patched_export(
            ckpt, "xnnpack", quant, "mean-4d", "psa_edge.model.transformer.rms_norm",
            rms_norm_4d, twin=twin)
    return {"rows": measure(paths, dp.task_context(ckpt, args.context), args),
            "calls": {who: delegate_calls(p) for who, p in paths.items()},
            "parity": all(json.loads(Path(f"{p}.json").read_text())["parity"]["passed"]
                          for p in paths.values())}


def layout_experiment(args, preset: str) -> dict:
    ckpt = checkpoint(preset)
    context = dp.task_context(ckpt, args.context)
    path, feeds = ort_layout_onnx(ckpt), shipped_feeds(ckpt, "onnx", context)
    paths = {"psa": artifact(ckpt, "onnx", None, False), "candidate": path,
             "twin": artifact(ckpt, "onnx", None, True)}
    diff = np.abs(ort_call(path, feeds)[1] - shipped_logits(paths["psa"], feeds)).max()
    return {"preset": preset, "rows": measure(paths, context, args, lambda p: ort_call(p, feeds)),
            "diff": float(diff), "nodes": {who: ort_node_types(p) for who, p in paths.items()}}


def resident_bytes(mode: str, shipped: Path, decode_only: Path, feeds: dict) -> int:
    """tools/shared_weights.py's reading of `mode`, from a fresh process."""
    return int(dp.in_fresh_process([str(Path(__file__).with_name("shared_weights.py"))], feeds,
                                   mode, shipped, decode_only).split()[-1])


def shared_decode_experiment(args, preset: str) -> dict:
    ckpt = checkpoint(preset)
    context = dp.task_context(ckpt, args.context)
    shipped = {who: artifact(ckpt, "onnx", None, who == "twin") for who in ("psa", "twin")}
    decode_only = {who: dp.decode_only_onnx(ckpt, who == "twin") for who in shipped}
    feeds = {who: dp.layer_calls(path, context)[1] for who, path in shipped.items()}
    counts = {}

    def decode_call(path):  # path: the shipped graph of the side
        who = next(w for w, p in shipped.items() if p == path)
        pair = open_shared(str(path), str(decode_only[who]))  # the closure keeps the weights
        counts[who] = pair[3]
        return (lambda: pair[1].run(None, feeds[who]), None), pair[1].run(["logits"],
                                                                          feeds[who])[0]

    paths = {**shipped, "candidate": shipped["psa"], "candidate.twin": shipped["twin"]}
    rows = measure(paths, context, args, decode_call)
    diff = np.abs(decode_call(shipped["psa"])[1] - shipped_logits(shipped["psa"],
                                                                  feeds["psa"])).max()
    prompt = {"input_ids": dp.task_context(ckpt, 128)[None].astype(np.int64),
              **{n: v[:, :, :0] for n, v in feeds["psa"].items() if n.endswith(("key", "value"))},
              **{n: np.zeros_like(v) for n, v in feeds["psa"].items() if n.endswith("prev_key")}}

    def prefill_call(who, path, _context):
        pair = (open_shared(str(path), str(decode_only["psa"])) if who == "candidate"
                else (dp.ort_session(path),))
        return {who: (lambda: pair[0].run(None, prompt), None)}

    prefill = dp.rounds_of({"candidate": shipped["psa"], "psa": shipped["psa"]}, context,
                           args, prefill_call, [("candidate", "psa")])
    memory = {mode: resident_bytes(mode, shipped["psa"], decode_only["psa"], feeds["psa"])
              for mode in MEMORY_MODES}
    return {"preset": preset, "rows": rows, "diff": float(diff), "counts": counts["psa"],
            "prefill": [("candidate", "psa", *dp.pair_times(prefill, "candidate", "psa"))],
            "memory": memory}


LABEL = {"psa": "shipped PSA", "twin": "twin", "candidate": "candidate PSA",
         "candidate.twin": "candidate twin"}


def timing_table(rows: list, timed: str = "backend call of `decode`") -> str:
    lines = [f"| pair ({timed}) | µs per call | µs per call | ratio [95% CI] |",
             "|---|---|---|---|"]
    lines += [f"| {LABEL[a]} / {LABEL[b]} | {ta * 1e6:.1f} | {tb * 1e6:.1f} | {ratio_text(r)} |"
              for a, b, ta, tb, r in rows]
    return "\n".join(lines)


def direction(rows: list, a: str = "candidate", b: str = "psa") -> str:
    """Where a's time lies against b's."""
    _, low, high = dp.interval(pair_ratios(rows, a, b))
    return {"above": "slower", "below": "faster",
            "across": "no difference this procedure resolves"}[dp.side_of_one(low, high)]


def pair_ratios(rows: list, a: str, b: str) -> list[float]:
    return next(r for x, y, _, _, r in rows if (x, y) == (a, b))


def pair_ratio(rows: list, a: str, b: str) -> str:
    return ratio_text(pair_ratios(rows, a, b))


def effect(rows: list, a: str = "candidate", b: str = "psa") -> str:
    return f"{LABEL[a]} / {LABEL[b]} {pair_ratio(rows, a, b)}: {direction(rows, a, b)}"


def node_table(layouts: list[dict]) -> str:
    lines = ["| preset | graph ONNX Runtime runs | nodes | Transpose | Reshape |",
             "|---|---|---|---|---|"]
    for exp in layouts:
        for who in ("psa", "candidate", "twin"):
            nodes = exp["nodes"][who]
            lines.append(f"| {exp['preset']} | {LABEL[who]} | {sum(nodes.values())} | "
                         f"{nodes['Transpose']} | {nodes['Reshape']} |")
    return "\n".join(lines)


def shared_section(shared: list[dict]) -> str:
    def cell(memory: dict, mode: str) -> str:
        change = "" if mode == "alone" else f" ({memory[mode] / memory['alone'] - 1:+.0%})"
        return f"{memory[mode] / 2**20:.1f}{change}"

    lines = ["| preset | shipped session alone (MB) | both sessions, weights shared, prepacking "
             "off (MB) | both sessions, weights shared, each prepacking (MB) |",
             "|---|---|---|---|"]
    lines += [f"| {e['preset']} | " + " | ".join(cell(e["memory"], mode) for mode in MEMORY_MODES)
              + " |" for e in shared]
    counts = ", ".join(f"{e['preset']} {e['counts'][0]} of {e['counts'][1]}" for e in shared)
    timing = "\n\n".join(
        f"{e['preset']} (max abs logit difference to the shipped graph {e['diff']:.1e}; "
        f"candidate = the decode-only graph's session):\n\n{timing_table(e['rows'])}\n\n"
        f"Prefill of 128 tokens on the shipped graph, prepacking off (candidate) against the "
        f"shipped session:\n\n{timing_table(e['prefill'], 'prefill call')}" for e in shared)
    return f"""## The decode-only graph beside the shipped one, sharing its weights (ONNX fp32)

[decode-profile.md](decode-profile.md) measured the decode-only graph (chunk length 1, so the
shift needs no Concat/Slice) faster for PSA, and what a second session with its own copy of the
weights costs in memory. Here the two sessions hold one copy: the decode-only graph's
initializers equal in content to one of the shipped graph's are given the shipped session's
OrtValues ({counts}; the rest are constants of its own; `tools/shared_weights.py`). ONNX
Runtime packs a MatMul's constant weights once per session, for its GEMM, and frees the
originals; shared weights it cannot free, so sharing saves memory only with prepacking off
(ONNX Runtime's container to share packed weights between sessions is in its C API, not in its
Python one). One-token steps run on the decode-only session, chunks on the shipped graph's.
Resident memory after a one-token step, each measured in a fresh process:

{chr(10).join(lines)}

{timing}"""


def shared_reading(e: dict) -> str:
    rows, memory = e["rows"], e["memory"]
    goal = verdict_of(pair_ratios(rows, "candidate", "candidate.twin"))
    return (f"- Shared decode-only, {e['preset']}: {effect(rows)}; in this form PSA / twin "
            f"{pair_ratio(rows, 'candidate', 'candidate.twin')}, against the {GOAL} goal: "
            f"{goal}; twin: {effect(rows, 'candidate.twin', 'twin')}; prefill: "
            f"{effect(e['prefill'])}; resident memory "
            f"{memory['shared'] / memory['alone'] - 1:+.0%} (with each session prepacking: "
            f"{memory['shared-prepacked'] / memory['alone'] - 1:+.0%}). Shipping it would also "
            "add a second graph to every ONNX artifact, and int8 would need a decode-only graph "
            "with its own calibration, not built here.")


def write(stacked: dict, means: dict, layouts: list[dict], shared: list[dict], args, run
          ) -> None:
    (wall, steal), m = run, machine()
    parity = "yes" if all(e["parity"] for e in means.values()) else "NO"
    sections = [f"""# Candidate fixes for PSA's decode overhead, measured and not shipped

Made by `python tools/overhead_candidates.py --context {args.context} --rounds {args.rounds} \
--blocks {args.blocks}` in {wall / 60:.0f} min on {m['cpu']} ({m['cores']} cores, {m['arch']};
{steal_sentence(steal)}), one thread, with the artifacts of [benchmarks.md](benchmarks.md)
(random weights, key-only gamma_k 0.8). What is timed is the backend call of one decode step at
a context of {args.context} tokens on prebuilt inputs, as in the first table of
[decode-profile.md](decode-profile.md): {args.rounds} rounds of freshly opened programs, the
load order alternating, each pair timed alone in {args.blocks} blocks of paired turns of about
4 ms; times are medians over rounds, ratios geometric means of the rounds' ratios with their
95% confidence intervals. Each ratio comes from its own pairs of turns, so the ratios of a table
need not multiply out: how far they miss shows the noise between pairs, and the candidate's
effect is read from the direct pair, candidate PSA / shipped PSA. Each candidate is one change
to a shipped build; its numbers are checked against that build on the same inputs.""",
                f"""## Stacked slot input (psa-4m, XNNPACK fp32)

The previous-key slots enter `decode` as one input `[layers, Hkv, 1, dh]` (after a one-token
step, the raw keys it returned, unchanged) instead of one input per layer: {stacked['inputs']}
inputs per call instead of {stacked['psa_inputs']}. Max abs logit difference to the shipped
program on the same step: {stacked['diff']:.1e}.

{timing_table(stacked['rows'])}""",
                f"""## RMSNorm's mean as a 4-D mean (psa-4m, XNNPACK)

XNNPACK's partitioner takes `mean.dim` only over dims (2, 3) of a 4-D tensor (global average
pooling), so RMSNorm's mean over the hidden dim stays outside the delegate and splits it. Here
it is written over a 4-D view `[B, S, D, 1]`, PSA and twin exported again (each passed the
exporter's parity probe against eager fp32: {parity}).
XNNPACK delegate calls per call, `forward` / `decode`:
""" + "\n".join(f"- {quant}: " + ", ".join(f"{LABEL[w]} {c}" for w, c in e["calls"].items())
                for quant, e in means.items()) + "\n\n" + "\n\n".join(
                    f"{quant}:\n\n{timing_table(e['rows'])}" for quant, e in means.items()),
                f"""## The keys in ONNX Runtime's layout (ONNX fp32)

ONNX Runtime's transpose optimizer moves attention's head transpose past RoPE, so the shear and
the shift run in `[.., S, H, dh]`; it then transposes each slot input, and the raw keys back,
to meet the graph's `[.., H, S, dh]` I/O. This graph states the layout itself (the slot
reshaped to `[1, 1, Hkv, dh]`, raw keys returned as `[layers, S, Hkv, dh]`, the same bytes for
a one-token step). Nodes of the graph ONNX Runtime runs after its optimizations:

{node_table(layouts)}

""" + "\n\n".join(f"{e['preset']} (max abs logit difference to the shipped graph "
                  f"{e['diff']:.1e}):\n\n{timing_table(e['rows'])}" for e in layouts),
                shared_section(shared)]
    reading = [f"- Stacked slot input: {effect(stacked['rows'])}. Shipping it would change "
               "the slot inputs SPEC §2 fixes per layer."]
    reading += [f"- 4-D mean, {quant}: {effect(e['rows'])}; twin: "
                f"{effect(e['rows'], 'candidate.twin', 'twin')}; candidate PSA / candidate twin "
                f"{pair_ratio(e['rows'], 'candidate', 'candidate.twin')}."
                " In `forward` the views to 4-D and back have the dynamic chunk length, so they "
                "stay outside XNNPACK and split it more (delegate calls above)."
                for quant, e in means.items()]
    reading += [f"- ORT layout, {e['preset']}: {effect(e['rows'])}. It trades the "
                "Transposes for Reshapes (node table), and the raw-key output's layout would "
                "differ between ONNX and ExecuTorch artifacts." for e in layouts]
    reading += [shared_reading(e) for e in shared]
    candidates = {"the stacked slot input": stacked["rows"],
                  **{f"the 4-D mean ({quant})": e["rows"] for quant, e in means.items()},
                  **{f"the ORT layout ({e['preset']})": e["rows"] for e in layouts},
                  **{f"the shared decode-only graph ({e['preset']})": e["rows"] for e in shared}}
    faster = [name for name, rows in candidates.items() if direction(rows) == "faster"]
    closing = ("No candidate made PSA's decode step measurably faster than the shipped build, "
               "so none is shipped." if not faster else
               f"Measurably faster than the shipped build: {', '.join(faster)}. Not shipped for "
               "what its line says it would change; a decision, not a measurement.")
    sections.append("## Reading it\n\n" + "\n".join(reading) + "\n\n" + closing)
    write_text(DOC, "\n\n".join(sections) + "\n")
    print(f"wrote {DOC.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=16, help="Fresh programs per pair.")
    parser.add_argument("--blocks", type=int, default=40, help="A B / B A blocks per round.")
    args = parser.parse_args()
    started, cpu_before = time.time(), cpu_times()
    stacked = stacked_experiment(args)
    print("stacked slot:", effect(stacked["rows"]), flush=True)
    means = {quant or "fp32": mean_4d_experiment(args, quant) for quant in (None, "int8")}
    print("4-D mean:", [effect(e["rows"]) for e in means.values()], flush=True)
    layouts = [layout_experiment(args, preset) for preset in ("psa-4m", "psa-30m")]
    shared = [shared_decode_experiment(args, preset) for preset in ("psa-4m", "psa-30m")]
    print("shared decode-only:", [effect(e["rows"]) for e in shared], flush=True)
    write(stacked, means, layouts, shared, args, (time.time() - started,
                                                  steal_share(cpu_before, cpu_times())))


if __name__ == "__main__":
    main()
