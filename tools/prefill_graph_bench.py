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
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids)


def onnx_runners(model, max_len, tmp):
    import onnxruntime as ort
    from torch.export import Dim

    from psa_edge.export.graphs import input_names
    from psa_edge.export.onnx_target import export_onnx_program, quiet, serialize_onnx

    explicit = Path(tmp) / "explicit.onnx"
    explicit.write_bytes(serialize_onnx(export_onnx_program(model, max_len)))
    full = Path(tmp) / "full.onnx"
    with quiet(), torch.no_grad():
        program = torch.onnx.export(FullSequence(model), (torch.zeros(1, 3, dtype=torch.long),),
                                    dynamic_shapes=({1: Dim("seq_len", min=1, max=max_len)},),
                                    input_names=["input_ids"], output_names=["logits"],
                                    dynamo=True, optimize=True)
    full.write_bytes(serialize_onnx(program))
    s_exp, s_full = ort.InferenceSession(str(explicit)), ort.InferenceSession(str(full))
    names = input_names(model.cfg)[1:]
    empty = {n: np.zeros((1, model.cfg.num_key_value_heads, 0 if n.endswith(("key", "value"))
                          else 1, model.cfg.head_dim), np.float32) for n in names}
    return (lambda ids: s_exp.run(None, {"input_ids": ids, **empty}),
            lambda ids: s_full.run(["logits"], {"input_ids": ids}))


def pte_runners(model, max_len, tmp):
    from executorch.runtime import Runtime
    from torch.export import Dim

    from psa_edge.export.executorch_target import export_program, lower_pte
    from psa_edge.export.graphs import ExplicitStateGraph, dynamic_shapes, example_inputs

    cfg = model.cfg
    explicit, _ = lower_pte(export_program(ExplicitStateGraph(model), example_inputs(cfg, 3, 4),
                                           dynamic_shapes(cfg, max_len)), "xnnpack")
    full, _ = lower_pte(export_program(FullSequence(model), (torch.zeros(1, 3, dtype=torch.long),),
                                       ({1: Dim("seq_len", min=1, max=max_len)},)), "xnnpack")
    methods = []
    for name, buffer in (("explicit.pte", explicit), ("full.pte", full)):
        (Path(tmp) / name).write_bytes(buffer)
        methods.append(Runtime.get().load_program(str(Path(tmp) / name)).load_method("forward"))
    empty = [t for t in example_inputs(cfg, 1, 0)[1:]]
    return (lambda ids: methods[0].execute([torch.from_numpy(ids), *empty]),
            lambda ids: methods[1].execute([torch.from_numpy(ids)]))


def main() -> None:
    from psa_edge.model.checkpoint import load_checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    model, _ = load_checkpoint(REPO / "models" / "psa-default.pt")
    ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (1, args.tokens))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend, make in (("onnxruntime", onnx_runners), ("executorch-xnnpack", pte_runners)):
            explicit, full = make(model, model.cfg.max_position_embeddings, tmp)
            times = {"explicit-state (P = 0)": [], "full-sequence (logits only)": []}
            for run in (explicit, full):
                run(ids)  # warm-up
            for _ in range(args.reps):  # interleaved, so drift hits both alike
                for label, run in zip(times, (explicit, full)):
                    start = time.perf_counter()
                    run(ids)
                    times[label].append(time.perf_counter() - start)
            for label, t in times.items():
                rows.append((backend, label, statistics.median(t) * 1e3, statistics.stdev(t) * 1e3))
                print(rows[-1], flush=True)
    lines = ["# Separate prefill graph or not", "",
             f"Made by `python tools/prefill_graph_bench.py --tokens {args.tokens} --reps "
             f"{args.reps}`: prefill of {args.tokens} tokens with the default model, median of "
             f"{args.reps} interleaved runs after a warm-up, torch threads default.", "",
             "| backend | graph | median (ms) | stddev (ms) |", "|---|---|---|---|"]
    lines += [f"| {b} | {g} | {m:.2f} | {s:.2f} |" for b, g, m, s in rows]
    (REPO / "docs" / "prefill-graph.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
