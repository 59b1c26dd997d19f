"""The shear's cost per layer in an ExecuTorch XNNPACK runner-form program, timed alone.

It is the floor under the runner form's PSA / twin decode ratio (docs/benchmarks.md's runner
block).

Two programs of `--layers` stand-in layers. In each, a layer's key comes out of an XNNPACK
delegate (`x * 1.5`, where the runner form has RoPE) and is written into a static cache by
ExecuTorch's llama `update_cache`, as in the runner form. The PSA program first shears it with
the runner form's own pieces: `RunnerRows`, the window's read (index_select, times
`continues`), `ops.shear` (the shift's Concat and Slice, then Sub, Mul, Add) and `write_rows`
(index_put_). Both take any chunk length, like the runner program, and are timed at S = 1 (a
decode step), taking turns, two ways:

- warm: the best of 9 rounds of 5000 calls back to back;
- cold: the best of 7 rounds' median call, each call timed alone after `--flush-mb` MiB of
  other data was read, as a decode step reads its weights between one layer's shear and the
  same layer's at the next token.

The difference per layer is the shear's cost, the delegate call it adds included.

    .venv/bin/python tools/shear_chain.py --heads 4 --head-dim 64
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from common import MAX_LEN, xnnpack_program

# Read between cold calls: twice the 32 MiB L3 of the host the docs' numbers come from. The cold
# cost grows with what was read (there 4.5, 5.1 and 6.8 us per layer after 32, 64 and 128 MiB),
# as a decode step's weights span it (about 16 MiB at psa-30m int4, 340 at psa-92m fp32): 64 is
# a middle, not a bound.
FLUSH_MB = 64


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
    """`forward` of the module lowered as the runner form is (any chunk length, the buffer
    writes kept in place): (program, method)."""
    import torch
    from torch.export import Dim

    example = (torch.randn(1, heads, 4, head_dim), torch.tensor([0]))
    seq = Dim("seq", min=1, max=MAX_LEN - 1)
    return xnnpack_program(module, example, ({2: seq}, None), reinplace=True)


def warm_us(method, inputs: list, calls: int) -> float:
    """Microseconds per call of `calls` calls back to back."""
    started = time.perf_counter()
    for i in range(calls):
        method.execute(inputs[i % len(inputs)])
    return (time.perf_counter() - started) / calls * 1e6


def cold_us(method, inputs: list, calls: int, flush: np.ndarray) -> float:
    """Median microseconds of `calls` calls, each timed alone after reading all of `flush`."""
    times = []
    for i in range(calls):
        flush.sum()
        started = time.perf_counter()
        method.execute(inputs[i % len(inputs)])
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1e6


def per_layer_us(heads: int, head_dim: int, window: int, layers: int = 8,
                 threads: int = 1, flush_mb: int = FLUSH_MB) -> dict:
    """Best microseconds per call of the twin and PSA chains at S = 1, warm and cold, and the
    differences per layer (`warm_per_layer_us`, `cold_per_layer_us`)."""
    from psa_edge.backends.executorch import load_llama_ops, set_threads

    load_llama_ops()
    set_threads(threads)
    import torch

    # Each (program, method) pair is kept whole: the method runs inside its program.
    lowered = {name: lowered_method(chain_module(layers, heads, head_dim, window, sheared),
                                    heads, head_dim)
               for name, sheared in (("twin", False), ("psa", True))}
    methods = {name: method for name, (_, method) in lowered.items()}
    step = torch.randn(1, heads, 1, head_dim)
    inputs = [[step, torch.tensor([MAX_LEN // 4 + i])] for i in range(MAX_LEN // 2)]
    flush = np.ones(flush_mb * 2**20 // 8)
    timers = {"warm": (9, lambda m: warm_us(m, inputs, 5000)),
              "cold": (7, lambda m: cold_us(m, inputs, 200, flush))}
    cost = {"layers": layers}
    for kind, (rounds, timer) in timers.items():
        best = {name: float("inf") for name in methods}
        for _ in range(rounds):
            for name, method in methods.items():
                best[name] = min(best[name], timer(method))
        cost |= {f"{kind}_twin_us": best["twin"], f"{kind}_psa_us": best["psa"],
                 f"{kind}_per_layer_us": (best["psa"] - best["twin"]) / layers}
    return cost


def main() -> None:
    from psa_edge.contract import RUNNER_WINDOW

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=4, help="KV heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flush-mb", type=int, default=FLUSH_MB,
                        help="MiB read before each cold call")
    args = parser.parse_args()
    if args.flush_mb < 1:
        parser.error(f"--flush-mb must be at least 1, not {args.flush_mb}")
    cost = per_layer_us(args.heads, args.head_dim, RUNNER_WINDOW, args.layers,
                        threads=args.threads, flush_mb=args.flush_mb)
    for kind in ("warm", "cold"):
        print(f"{args.layers} layers at S = 1, {kind}: twin {cost[kind + '_twin_us']:.2f} us, "
              f"PSA {cost[kind + '_psa_us']:.2f} us per call; the shear "
              f"{cost[kind + '_per_layer_us']:.2f} us per layer")


if __name__ == "__main__":
    main()
