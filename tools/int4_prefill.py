"""docs/benchmarks.md's int4-prefill block: where a psa-4m int4 prefill's time goes on each
backend, against llama.cpp's whole Q4_0 prefill of the twin.

    .venv/bin/python tools/int4_prefill.py --preset psa-4m --threads 1 2 --rounds 3

Per round and thread count, taking turns:

- llama.cpp: `llama-bench -p P -n 0 -r 10` on the twin's Q4_0 GGUF (`llama_cpp_bench.py`'s
  build and files).
- ExecuTorch XNNPACK, explicit-state int4 (8da4w): the session's prefill as `psa-edge bench`
  times it (the last row's logits asked for; this form computes every row's), the program's
  `forward` call alone on the same inputs, and the weight kernels alone: a program of the
  preset's linears only (same shapes and order, `quantize_8da4w`'s groups, lowered the way the
  exporter lowers), with every row through the output projection and with the last row only;
  and the attention alone: the model's own `attend` of every layer, the causal bias built once,
  in fp32 as in the int4 program.
- ONNX Runtime, fused int4 (MatMulNBits): its prefill, and the MatMulNBits kernels' share of it
  from `psa-edge bench --profile`.

The table gives medians over rounds, in milliseconds per P-token prefill.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from common import (OUT, artifact, commit, machine, page_with_block, psa_edge_json,
                    write_block, xnnpack_program)
from llama_cpp_bench import build_llama_cpp, gguf_builds, llama_bench

from psa_edge.io import write_json
from psa_edge.model import PRESETS

FOLDER = OUT / "int4-prefill"
CALLS = 50  # timed calls of each program per round, after 10 untimed


def linears_module(preset: str, last_row: bool):
    """The preset's weight matrices in a transformer's order, nothing else: per layer q, k, v
    on the layer's input, o on q plus k + v (tiled to q's width), the MLP's gate and up, their
    product into down; then the output projection, on every row or the last."""
    import torch
    from torch import nn

    cfg = PRESETS[preset]
    hidden, inner, heads = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"]
    kv = hidden // heads * cfg["num_key_value_heads"]
    shapes = dict(q=(hidden, hidden), k=(hidden, kv), v=(hidden, kv), o=(hidden, hidden),
                  gate=(hidden, inner), up=(hidden, inner), down=(inner, hidden))

    class Linears(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(
                nn.ModuleDict({name: nn.Linear(*shape, bias=False)
                               for name, shape in shapes.items()})
                for _ in range(cfg["num_hidden_layers"]))
            self.head = nn.Linear(hidden, cfg["vocab_size"], bias=False)

        def forward(self, h):
            for w in self.layers:
                # o takes q with k + v tiled to its width, so that no product is dead code
                kv_sum = w["k"](h) + w["v"](h)
                h = w["o"](w["q"](h) + torch.cat([kv_sum] * (hidden // kv), -1))
                h = w["down"](w["gate"](h) * w["up"](h))
            return self.head(h[:, -1:] if last_row else h)

    return Linears().eval()


def attention_module(preset: str):
    """The model's own attention (`transformer.attend`, the causal bias built once) of every
    layer, on given queries, keys and values: its arithmetic without the linears around it."""
    import torch
    from torch import nn

    from psa_edge.model.ops import causal_bias
    from psa_edge.model.transformer import attend

    cfg = PRESETS[preset]
    group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]

    class Attention(nn.Module):
        def forward(self, query, keys, values):
            bias = causal_bias(torch.arange(query.shape[2]), keys.shape[2], group)
            out = query
            for _ in range(cfg["num_hidden_layers"]):
                out = attend(query, keys, values, bias, group)
                query = out.reshape(query.shape)
            return out

    return Attention().eval()


def lowered_pieces(preset: str, tokens: int) -> dict:
    """name -> (program, forward method, inputs): the linears (every row, last row) and the
    attention, each lowered to XNNPACK."""
    import torch

    from psa_edge.export.quantize import quantize_8da4w

    cfg = PRESETS[preset]
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    stream = (1, cfg["num_key_value_heads"], tokens, head_dim)
    query = (1, cfg["num_attention_heads"], tokens, head_dim)
    hidden = (torch.randn(1, tokens, cfg["hidden_size"]),)
    return {"linears_every_row": lowered(quantize_8da4w(linears_module(preset, False)), hidden),
            "linears_last_row": lowered(quantize_8da4w(linears_module(preset, True)), hidden),
            "attention": lowered(attention_module(preset), (torch.randn(query),
                                 torch.randn(stream), torch.randn(stream)))}


def lowered(module, example: tuple):
    """(program, forward method, inputs) of `module`, lowered to XNNPACK."""
    return (*xnnpack_program(module, example), list(example))


def median_ms(call) -> float:
    for _ in range(10):
        call()
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def xnnpack_times(path: Path, threads: int, pieces: dict, prompt: np.ndarray) -> dict:
    """Milliseconds of the session's prefill, of its program's call alone, and of each piece."""
    from psa_edge.backends.executorch import as_torch
    from psa_edge.runtime.bench import Runner

    runner = Runner(path, threads)
    graph, recorded = runner.session.graph, []
    run = graph.run

    def recording(feeds):
        recorded.append(feeds)
        return run(feeds)

    graph.run = recording
    runner.prefill(np.zeros(0, np.int64), prompt)
    graph.run = run
    args = [as_torch(recorded[0][n]) for n in graph.io.input_names]
    times = {"session": median_ms(lambda: runner.prefill(np.zeros(0, np.int64), prompt)),
             "program": median_ms(lambda: graph.method.execute(args))}
    for name, (_, method, inputs) in pieces.items():
        times[name] = median_ms(lambda: method.execute(inputs))
    return times


def onnx_times(path: Path, tokens: int, threads: int) -> dict:
    report = psa_edge_json("bench", path, "--profile", "-p", tokens, "-n", 1, "-r", 20,
                           "--threads", threads)["prefill"]
    return {"prefill": report["wall_us_per_prefill"] / 1e3,
            "matmulnbits": report["kernel_us_per_prefill"].get("MatMulNBits", 0) / 1e3}


def llama_ms(binaries: Path, gguf: Path, tokens: int, threads: int) -> float:
    """Milliseconds of llama-bench's `tokens`-token prefill (its mean over 10 repetitions)."""
    rate = llama_bench(binaries, gguf, threads, argparse.Namespace(p=tokens, n=0, r=10))["pp"]
    return 1e3 * tokens / rate


def measure(args) -> list[dict]:
    from psa_edge.backends.executorch import load_llama_ops, set_threads

    load_llama_ops()
    binaries = build_llama_cpp()
    gguf = gguf_builds(args.preset, binaries)["Q4_0"]
    xnnpack = artifact(args.preset, "xnnpack", "int4", False, "explicit-state")
    onnx = artifact(args.preset, "onnx", "int4", False, "fused")
    prompt = np.random.default_rng(0).integers(0, PRESETS[args.preset]["vocab_size"], args.p)
    rounds = []
    for threads in args.threads:
        set_threads(threads)
        pieces = lowered_pieces(args.preset, args.p)
        for _ in range(args.rounds):
            rounds.append({"threads": threads, "preset": args.preset, "tokens": args.p,
                           "commit": commit(), "machine": machine(),
                           "llama.cpp": llama_ms(binaries, gguf, args.p, threads),
                           "xnnpack": xnnpack_times(xnnpack, threads, pieces, prompt),
                           "onnx": onnx_times(onnx, args.p, threads)})
            print(rounds[-1], flush=True)
    return rounds


def flat(round_: dict) -> dict[str, float]:
    """A round's times by name: "llama.cpp", then "xnnpack session", "onnx prefill", ..."""
    times = {"llama.cpp": round_["llama.cpp"]}
    for backend in ("xnnpack", "onnx"):
        times.update((f"{backend} {piece}", ms) for piece, ms in round_[backend].items())
    return times


def medians(rounds: list[dict], threads: int) -> dict[str, float]:
    """The median over the rounds at `threads` of every time they hold."""
    mine = [flat(r) for r in rounds if r["threads"] == threads]
    return {key: statistics.median(r[key] for r in mine) for key in mine[0]}


def table(rounds: list[dict], threads: list[int]) -> str:
    lines = ["| threads | llama.cpp Q4_0 prefill (twin) | XNNPACK int4: session prefill / "
             "program call | its linears alone: every row / last row | last row / llama.cpp "
             "| its attention alone | ONNX Runtime fused int4: prefill, profiled | its "
             "MatMulNBits kernels | kernels / llama.cpp |", "|" + "---|" * 9]
    for n in threads:
        m = medians(rounds, n)
        llama = m["llama.cpp"]
        lines.append(f"| {n} | {llama:.2f} | {m['xnnpack session']:.2f} / "
                     f"{m['xnnpack program']:.2f} | {m['xnnpack linears_every_row']:.2f} / "
                     f"{m['xnnpack linears_last_row']:.2f} | "
                     f"**{m['xnnpack linears_last_row'] / llama:.2f}** | "
                     f"{m['xnnpack attention']:.2f} | "
                     f"{m['onnx prefill']:.2f} | {m['onnx matmulnbits']:.2f} | "
                     f"**{m['onnx matmulnbits'] / llama:.2f}** |")
    return "\n".join(lines)


def findings(rounds: list[dict], threads: list[int]) -> str:
    """What the table says, per thread count, computed from it."""
    lines = []
    for n in threads:
        m = medians(rounds, n)
        llama, session = m["llama.cpp"], m["xnnpack session"]
        rest = m["xnnpack program"] - m["xnnpack linears_every_row"] - m["xnnpack attention"]
        other_rows = m["xnnpack linears_every_row"] - m["xnnpack linears_last_row"]
        lines.append(
            f"- {n} thread{'s' * (n > 1)}: XNNPACK's prefill is {llama / session:.2f} of "
            f"llama.cpp's speed. Its program's call beyond the weight kernels and the "
            f"attention takes {rest:.2f} ms ({rest / llama:.2f} of llama.cpp's whole "
            f"prefill); the output "
            f"projection of every row but the last takes {other_rows:.2f} ms; less that, the "
            f"prefill would be {llama / (session - other_rows):.2f} of llama.cpp's speed (by "
            f"subtraction, not measured). ONNX Runtime's MatMulNBits kernels alone take "
            f"{m['onnx matmulnbits'] / llama:.2f} of llama.cpp's whole prefill.")
    return "\n".join(lines)


def page(rounds: list[dict]) -> str:
    """The block: how it was measured (from the rounds' own record), findings and table."""
    first, threads = rounds[0], sorted({r["threads"] for r in rounds})
    measured = min(sum(r["threads"] == n for r in rounds) for n in threads)
    return (f"{first['machine']}, psa-edge at commit {first['commit']}; {first['preset']}, "
            f"random weights on the 4-bit grid (the llama.cpp block's builds), PSA key-only 0.8 "
            f"against llama.cpp's Q4_0 of its twin. Milliseconds per {first['tokens']}-token "
            f"prefill from an empty cache, medians of {measured} round{'s' * (measured > 1)} "
            f"taking turns "
            f"(llama-bench -r 10; each psa-edge time a median of {CALLS} calls):\n\n"
            + findings(rounds, threads) + "\n\n" + table(rounds, threads) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="psa-4m", choices=list(PRESETS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--render", action="store_true", help="the block from the last results")
    args = parser.parse_args()
    page_with_block("int4-prefill", "docs/benchmarks.md")
    results = FOLDER / "results.json"
    if args.render:
        if not results.exists():
            raise SystemExit(f"{results} does not exist: measure first (without --render)")
        rounds = json.loads(results.read_text())
    else:
        rounds = measure(args)
        FOLDER.mkdir(parents=True, exist_ok=True)
        write_json(results, rounds)
    block = page(rounds)
    write_block("int4-prefill", block, "docs/benchmarks.md")
    print(block)


if __name__ == "__main__":
    main()
