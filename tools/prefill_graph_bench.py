"""Is a separate full-sequence prefill graph faster than the explicit-state graph at P = 0?

Exports the default model twice per backend (ONNX Runtime, ExecuTorch XNNPACK): the
explicit-state graph psa-edge ships, and a logits-only full-sequence graph (no state inputs, no
state outputs). Times a prefill of `--tokens` tokens, interleaved, `--reps` repetitions after a
warm-up, and writes docs/prefill-graph.md.

    python tools/prefill_graph_bench.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent


class FullSequence(torch.nn.Module):
    """A prefill-only graph: no past inputs; logits plus the state a decoder continues from
    (with `state=False`, logits only: the upper bound of what dropping the state could save)."""

    def __init__(self, model, state: bool):
        super().__init__()
        self.model, self.state = model, state

    def forward(self, input_ids):
        logits, new_state, raws = self.model.forward_with_state(input_ids,
                                                                self.model.empty_state(1))
        if not self.state:
            return logits
        return (logits, *[t for layer in new_state for t in layer.values()],
                *[t for layer in raws for t in layer.values()])


def onnx_runners(model, max_len, tmp):
    import onnxruntime as ort
    from torch.export import Dim

    from psa_edge.export.graphs import example_inputs, input_names
    from psa_edge.export.onnx_target import export_onnx_program, quiet, serialize_onnx

    explicit = Path(tmp) / "explicit.onnx"
    explicit.write_bytes(serialize_onnx(export_onnx_program(model, max_len).model_proto))
    sessions = [ort.InferenceSession(str(explicit))]
    for state in (True, False):
        full = Path(tmp) / f"full{state}.onnx"
        with quiet(), torch.no_grad():
            program = torch.onnx.export(
                FullSequence(model, state), (torch.zeros(1, 3, dtype=torch.long),),
                dynamic_shapes=({1: Dim("seq_len", min=1, max=max_len)},),
                input_names=["input_ids"], dynamo=True, optimize=True)
        full.write_bytes(serialize_onnx(program.model_proto))
        sessions.append(ort.InferenceSession(str(full)))
    empty = {n: t.numpy() for n, t in zip(input_names(model.cfg)[1:],
                                          example_inputs(model.cfg, 1, 0)[1:])}
    return (lambda ids: sessions[0].run(None, {"input_ids": ids, **empty}),
            lambda ids: sessions[1].run(None, {"input_ids": ids}),
            lambda ids: sessions[2].run(None, {"input_ids": ids}))


def pte_runners(model, max_len, tmp):
    from executorch.runtime import Runtime
    from torch.export import Dim

    from psa_edge.export.executorch_target import export_program, lower_pte
    from psa_edge.export.graphs import ExplicitStateGraph, dynamic_shapes, example_inputs

    cfg = model.cfg
    explicit, _ = lower_pte({"forward": export_program(
        ExplicitStateGraph(model), example_inputs(cfg, 3, 4), dynamic_shapes(cfg, max_len))},
        "xnnpack")
    fulls = [lower_pte({"forward": export_program(
        FullSequence(model, state), (torch.zeros(1, 3, dtype=torch.long),),
        ({1: Dim("seq_len", min=1, max=max_len)},))}, "xnnpack")[0] for state in (True, False)]
    methods = []
    for name, buffer in (("explicit.pte", explicit), ("prefill.pte", fulls[0]),
                         ("logits.pte", fulls[1])):
        (Path(tmp) / name).write_bytes(buffer)
        methods.append(Runtime.get().load_program(str(Path(tmp) / name)).load_method("forward"))
    empty = [t for t in example_inputs(cfg, 1, 0)[1:]]
    return (lambda ids: methods[0].execute([torch.from_numpy(ids), *empty]),
            lambda ids: methods[1].execute([torch.from_numpy(ids)]),
            lambda ids: methods[2].execute([torch.from_numpy(ids)]))


def main() -> None:
    from psa_edge.model.checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=300)
    args = parser.parse_args()
    model, _ = load_checkpoint(REPO / "models" / "psa-default.pt")
    ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (1, args.tokens))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend, make in (("onnxruntime", onnx_runners), ("executorch-xnnpack", pte_runners)):
            runs = make(model, model.cfg.max_position_embeddings, tmp)
            times = {"explicit-state graph, P = 0 (shipped)": [],
                     "prefill-only graph (no past inputs, same outputs)": [],
                     "logits-only graph (no state out; cannot feed a decoder)": []}
            for run in runs:
                run(ids)  # warm-up
            for _ in range(args.reps):  # interleaved, so drift hits all alike
                for label, run in zip(times, runs):
                    start = time.perf_counter()
                    run(ids)
                    times[label].append(time.perf_counter() - start)
            for label, t in times.items():
                rows.append((backend, label, statistics.median(t) * 1e3, statistics.stdev(t) * 1e3))
                print(rows[-1], flush=True)
    lines = ["# Separate prefill graph or not", "",
             f"Made by `python tools/prefill_graph_bench.py --tokens {args.tokens} --reps "
             f"{args.reps}`: prefill of {args.tokens} tokens with the default model, median of "
             f"{args.reps} interleaved runs after a warm-up, default threads.", "",
             "| backend | graph | median (ms) | stddev (ms) | vs shipped |", "|---|---|---|---|---|"]
    base = {b: m for b, g, m, _ in rows if "shipped" in g}
    lines += [f"| {b} | {g} | {m:.3f} | {s:.3f} | {m / base[b]:.3f} |" for b, g, m, s in rows]
    (REPO / "docs" / "prefill-graph.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
