"""The shear's cost per layer in an ExecuTorch XNNPACK runner-form program, timed alone.

It is the floor under the runner form's PSA / twin decode ratio (docs/benchmarks.md's runner
block).

Two programs of `--layers` stand-in layers. In each, a layer's key comes out of an XNNPACK
delegate (`x * 1.5`, where the runner form has RoPE) and is written into a static cache by
ExecuTorch's llama `update_cache`, as in the runner form. The PSA program first shears it with
the runner form's own pieces: `RunnerRows`, the window's read (index_select, times
`continues`), `ops.shear` (the shift's Concat and Slice, then Sub, Mul, Add) and `write_rows`
(index_put_). Both take any chunk length, like the runner program, and are timed at S = 1 (a
decode step): the best of 9 rounds of 5000 calls each (`per_layer_us`), taking turns. The
difference per layer is the shear's cost, the delegate call it adds included.

    .venv/bin/python tools/shear_chain.py --heads 4 --head-dim 64
"""

from __future__ import annotations

import argparse
import time

from common import MAX_LEN


def chain_module(layers: int, heads: int, head_dim: int, window: int, sheared: bool):
    import torch
    from torch import nn

    from psa_edge.export.forms import RunnerRows, write_rows
    from psa_edge.model.ops import shear

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            for i in range(layers):
                self.register_buffer(f"cache_{i}", torch.zeros(1, MAX_LEN, heads,
                                                                head_dim), persistent=False)
                self.register_buffer(f"raw_{i}", torch.zeros(1, heads, window + 1, head_dim),
                                     persistent=False)

        def forward(self, x, input_pos):
            rows = RunnerRows(input_pos, x.shape[2], MAX_LEN, window)
            out = x
            for i in range(layers):
                key = sheared_key = out * 1.5
                if sheared:  # in the order of the runner form's layer
                    raw = getattr(self, f"raw_{i}")
                    slot = raw.index_select(2, rows.previous_row) * rows.continues
                    sheared_key = shear(key, slot, 0.8)
                    write_rows(raw, rows.ring_rows, key)
                torch.ops.llama.update_cache(sheared_key.transpose(1, 2),
                                             getattr(self, f"cache_{i}"), rows.start)
                out = out + sheared_key
            return out

    return Chain()


def lowered_method(module, heads: int, head_dim: int):
    """`forward` of the module lowered as the runner form is: `executorch_target.to_edge`
    (XNNPACK), then the reinplace pass that keeps the buffer writes in place."""
    import torch
    from executorch.exir import ExecutorchBackendConfig
    from executorch.runtime import Runtime
    from torch.export import Dim

    from psa_edge.export import quiet
    from psa_edge.export.executorch_target import to_edge

    example = (torch.randn(1, heads, 4, head_dim), torch.tensor([0]))
    seq = Dim("seq", min=1, max=MAX_LEN - 1)
    with quiet():
        program = torch.export.export(module, example, dynamic_shapes=({2: seq}, None))
        edge = to_edge(program, delegated=True)
        pte = edge.to_executorch(ExecutorchBackendConfig(run_reinplace_pass=True))
    loaded = Runtime.get().load_program(pte.buffer)
    return loaded, loaded.load_method("forward")


def per_layer_us(heads: int, head_dim: int, window: int, layers: int = 8, calls: int = 5000,
                 rounds: int = 9, threads: int = 1) -> dict:
    """Best microseconds per call of the twin and PSA chains at S = 1, and their difference
    per layer."""
    from psa_edge.backends.executorch import load_llama_ops, set_threads

    load_llama_ops()
    set_threads(threads)
    import torch

    methods = {}
    for name, sheared in (("twin", False), ("psa", True)):
        module = chain_module(layers, heads, head_dim, window, sheared)
        methods[name] = lowered_method(module, heads, head_dim)
    step = torch.randn(1, heads, 1, head_dim)
    positions = [torch.tensor([MAX_LEN // 4 + i]) for i in range(MAX_LEN // 2)]
    best = {name: float("inf") for name in methods}
    for _ in range(rounds):
        for name, (_, method) in methods.items():
            started = time.perf_counter()
            for i in range(calls):
                method.execute([step, positions[i % len(positions)]])
            best[name] = min(best[name], (time.perf_counter() - started) / calls * 1e6)
    return {"twin_us": best["twin"], "psa_us": best["psa"], "layers": layers,
            "per_layer_us": (best["psa"] - best["twin"]) / layers}


def main() -> None:
    from psa_edge.contract import RUNNER_WINDOW

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4, help="KV heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    cost = per_layer_us(args.heads, args.head_dim, RUNNER_WINDOW, args.layers,
                        threads=args.threads)
    print(f"{args.layers} layers at S = 1: twin {cost['twin_us']:.2f} us, PSA "
          f"{cost['psa_us']:.2f} us per call; the shear {cost['per_layer_us']:.2f} us per layer")


if __name__ == "__main__":
    main()
