"""docs/speculative.md: speculative decoding of the default model on induction-heavy prompts,
with the int8 build of the target as draft and with the draft-free prompt-lookup drafter.

    .venv/bin/python tools/speculative_table.py        # a few minutes

Prompts: held-out ih-sht sequences (every token after the first repeats of an alphabet of 64
recur; the model continues by induction), the first `--prompt-len` tokens of each, greedy
continuation of `--new` tokens. For each backend (ONNX Runtime, ExecuTorch XNNPACK; fp32
target) and drafter, and for draft lengths 2, 4, 8: drafted and accepted tokens, acceptance
rate, tokens per target call, wall time of the decode against plain greedy decoding of the
same target (speed-up > 1 is faster), and whether the tokens equal plain greedy decoding
(docs/spec.md §5: they must, bar ties). Plain and speculative runs alternate per prompt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import DEFAULT_MODEL, OUT, export_once, machine, write_doc

from psa_edge.runtime.generate import generate
from psa_edge.runtime.session import open_session
from psa_edge.runtime.speculative import (PromptLookupDrafter, SessionDrafter,
                                          speculative_generate)
from psa_edge.tasks import task_from_dict

BACKENDS = {"onnx": "ONNX Runtime", "xnnpack": "ExecuTorch XNNPACK"}


def export(target: str, quant: str | None) -> Path:
    return export_once(DEFAULT_MODEL, OUT / "speculative" / f"default-{target}-{quant or 'fp32'}",
                       target, quant)


def measure(target: str, prompts, new: int, draft_lens) -> list[dict]:
    session = open_session(export(target, None))
    vocab = session.io.vocab_size
    drafters = {"int8 self-draft": lambda: SessionDrafter(open_session(export(target, "int8")),
                                                          vocab),
                "prompt lookup": PromptLookupDrafter}
    rows = []
    for label, make in drafters.items():
        for k in draft_lens:
            drafter = make()
            plain_s = spec_s = 0.0
            drafted = accepted = calls = produced = 0
            same = True
            for prompt in prompts:
                plain = generate(session, prompt, new)
                started = time.perf_counter()
                spec = speculative_generate(session, drafter, prompt, new, draft_len=k)
                spec_s += time.perf_counter() - started
                started = time.perf_counter()
                generate(session, prompt, new)  # the plain time, measured right after
                plain_s += time.perf_counter() - started
                same &= spec.tokens == plain.tokens
                drafted += spec.stats["drafted"]
                accepted += spec.stats["accepted"]
                calls += spec.stats["target_calls"]
                produced += len(spec.tokens)
            rows.append({"backend": BACKENDS[target], "drafter": label, "k": k,
                         "drafted": drafted, "accepted": accepted,
                         "acceptance": accepted / max(1, drafted),
                         "tokens_per_call": produced / max(1, calls),
                         "plain_s": plain_s, "spec_s": spec_s, "speedup": plain_s / spec_s,
                         "identical": same})
            print(rows[-1], flush=True)
    return rows


def reading(rows: list[dict]) -> str:
    lookup = [r for r in rows if r["drafter"] == "prompt lookup"]
    int8 = [r for r in rows if r["drafter"] == "int8 self-draft"]
    best = max(lookup, key=lambda r: r["speedup"])
    text = (f"The prompt-lookup drafter costs only a search of the context and proposes the "
            f"induction continuation: best speed-up {best['speedup']:.2f} ({best['backend']}, "
            f"k = {best['k']}). The int8 self-draft runs a whole model per drafted token: "
            f"speed-up {min(r['speedup'] for r in int8):.2f} to "
            f"{max(r['speedup'] for r in int8):.2f} at acceptance "
            f"{min(r['acceptance'] for r in int8):.2f} to {max(r['acceptance'] for r in int8):.2f}.")
    if max(r["speedup"] for r in int8) < 1:
        text += (" On a model this small a draft token costs about as much as a target token, "
                 "so a model draft cannot pay; it does where the target costs many times the "
                 "draft.")
    if not all(r["identical"] for r in rows):
        text += " Some outputs differ from plain greedy decoding: see the last column."
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    (OUT / "speculative").mkdir(parents=True, exist_ok=True)
    from psa_edge.model.checkpoint import read_checkpoint

    task = task_from_dict(read_checkpoint(DEFAULT_MODEL)["metadata"]["task"])
    inputs, _ = task.sample("test", args.prompts, seed=4242)
    prompts = [row[:args.prompt_len] for row in inputs]
    started = time.time()
    rows = [r for target in BACKENDS for r in measure(target, prompts, args.new, (2, 4, 8))]
    table = ["| backend | drafter | draft length | accepted / drafted | acceptance | tokens per "
             "target call | decode wall time, plain / speculative (s) | speed-up | output == "
             "plain greedy |", "|---|---|---|---|---|---|---|---|---|"]
    table += [f"| {r['backend']} | {r['drafter']} | {r['k']} | {r['accepted']} / {r['drafted']} "
              f"| {r['acceptance']:.3f} | {r['tokens_per_call']:.2f} | {r['plain_s']:.3f} / "
              f"{r['spec_s']:.3f} | {r['speedup']:.2f} | {'yes' if r['identical'] else 'NO'} |"
              for r in rows]
    doc = f"""# Speculative decoding of the default model

Made by `.venv/bin/python tools/speculative_table.py --prompts {args.prompts} --prompt-len
{args.prompt_len} --new {args.new}` on {machine()} in {(time.time() - started) / 60:.0f} min. Target: `models/psa-default.pt` exported fp32; drafts: its
static int8 build on the same backend, and the prompt-lookup drafter (no model). Prompts: the
first {args.prompt_len} tokens of {args.prompts} held-out ih-sht sequences, greedy continuation of
{args.new} tokens each. Every speculative round feeds the target `[pending, d_1..d_k]` in one
call and rolls its state back past the first rejection (`Session.rollback`, the previous-key
slot set from the raw keys the graph returns).

{chr(10).join(table)}

Reading it: a draft that agrees lets the target produce up to k + 1 tokens per call; whether
that is faster depends on what a draft token costs. {reading(rows)}
"""
    write_doc("speculative.md", doc)
    print(doc)


if __name__ == "__main__":
    main()
