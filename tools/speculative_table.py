"""docs/results/speculative.md: speculative decoding of the default model on ih-sht prompts and of
the code model on real code (`--prompt-len` tokens before the middle of held-out standard-library
files), drafted by the target's own int8 build (a draft model) and by prompt lookup.

    .venv/bin/python tools/speculative_table.py        # a few minutes

Per model, backend and drafter, at draft lengths 2, 4, 8: acceptance, tokens per target call,
decode wall time against plain greedy decoding run right after it, and whether the tokens equal
plain greedy decoding (docs/reference/spec.md §5: they must, bar ties).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import DEFAULT_MODEL, OUT, REPO, export_once, machine, write_doc

from psa_edge.runtime.generate import generate
from psa_edge.runtime.session import open_session
from psa_edge.runtime.speculative import (PromptLookupDrafter, SessionDrafter,
                                          speculative_generate)
from psa_edge.tasks import task_from_dict

BACKENDS = {"onnx": "ONNX Runtime", "xnnpack": "ExecuTorch XNNPACK"}
MODELS = {"default": (DEFAULT_MODEL, "int8"), "code": (REPO / "models" / "psa-code.pt",
                                                        "int8-dynamic")}


def export(model: str, target: str, quant: str | None) -> Path:
    return export_once(MODELS[model][0], OUT / "speculative" / f"{model}-{target}-"
                       f"{quant or 'fp32'}", target, quant, max_seq_len=256)


def prompts_for(model: str, args) -> list:
    from psa_edge.model.checkpoint import read_checkpoint

    if model == "default":
        task = task_from_dict(read_checkpoint(DEFAULT_MODEL)["metadata"]["task"])
        return [row[:args.prompt_len] for row in task.sample("test", args.prompts, seed=4242)[0]]
    import sysconfig

    from psa_edge.tasks.text import read_corpus

    tokenizer = open_session(export("code", "onnx", None)).tokenizer
    files = [tokenizer.encode(t) for t in read_corpus([sysconfig.get_paths()["stdlib"]])
             .split("test")]
    long = [ids for ids in files if len(ids) >= 2 * args.prompt_len][:args.prompts]
    return [ids[len(ids) // 2 - args.prompt_len:len(ids) // 2] for ids in long]


def measure(model: str, target: str, prompts, new: int, draft_lens) -> list[dict]:
    session = open_session(export(model, target, None))
    vocab = session.io.vocab_size
    draft = lambda: open_session(export(model, target, MODELS[model][1]))  # noqa: E731
    drafters = {"int8 self-draft": lambda: SessionDrafter(draft(), vocab),
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
            rows.append({"model": model, "backend": BACKENDS[target], "drafter": label, "k": k,
                         "drafted": drafted, "accepted": accepted,
                         "acceptance": accepted / max(1, drafted),
                         "tokens_per_call": produced / max(1, calls),
                         "plain_s": plain_s, "spec_s": spec_s, "speedup": plain_s / spec_s,
                         "identical": same})
            print(rows[-1], flush=True)
    return rows


def reading(rows: list[dict]) -> str:
    best = {d: max((r for r in rows if r["drafter"] == d), key=lambda r: r["speedup"])
            for d in ("prompt lookup", "int8 self-draft")}
    return (" ".join(f"Best with {d}: speed-up {r['speedup']:.2f} ({r['backend']}, k = {r['k']}, "
                     f"acceptance {r['acceptance']:.2f})." for d, r in best.items())
            + (" A model draft costs about what the target does here, so it cannot pay; prompt "
               "lookup costs only a search of the context." if best["int8 self-draft"]["speedup"]
               < 1 else "") + ("" if all(r["identical"] for r in rows) else
                               " Some outputs differ from plain greedy decoding: last column."))


def section(rows: list[dict]) -> str:
    table = ["| backend | drafter | draft length | accepted / drafted | tokens per target call | "
             "decode wall time, plain / speculative (s) | speed-up | output == plain greedy |",
             "|---|---|---|---|---|---|---|---|"]
    table += [f"| {r['backend']} | {r['drafter']} | {r['k']} | {r['accepted']} / {r['drafted']} "
              f"({r['acceptance']:.3f}) | {r['tokens_per_call']:.2f} | {r['plain_s']:.3f} / "
              f"{r['spec_s']:.3f} | {r['speedup']:.2f} | {'yes' if r['identical'] else 'NO'} |"
              for r in rows]
    return "\n".join(table) + f"\n\nReading it: {reading(rows)}\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    args = parser.parse_args()
    (OUT / "speculative").mkdir(parents=True, exist_ok=True)
    started = time.time()
    sections = {m: section([r for target in BACKENDS for r in measure(
        m, target, prompts_for(m, args), args.new, (2, 4, 8))]) for m in MODELS}
    write_doc("speculative.md", f"""# Speculative decoding

Made by `.venv/bin/python tools/speculative_table.py --prompts {args.prompts} --prompt-len
{args.prompt_len} --new {args.new}` on {machine()} in {(time.time() - started) / 60:.0f} min.
Targets exported fp32 (max length 256); drafts: the target's own int8 build on the same backend
(a draft model), and the prompt-lookup drafter (no model: it proposes what followed the last
matching n-gram of the context). Every speculative round feeds the target `[pending,
d_1..d_k]` in one call and rolls its state back past the first rejection (`Session.rollback`,
the previous-key slot set from the raw keys the graph returns). A draft that agrees lets the
target produce up to k + 1 tokens per call; whether that is faster depends on what a draft
token costs.

## The default model on induction prompts

`models/psa-default.pt`; the first {args.prompt_len} tokens of {args.prompts} held-out ih-sht
sequences, {args.new} new tokens each.

{sections["default"]}
## The code model on real code

`models/psa-code.pt` (key-only, BPE vocabulary); {args.prompts} held-out standard-library
files, the {args.prompt_len} tokens before each file's middle, {args.new} new tokens each.

{sections["code"]}""")
    print(sections)


if __name__ == "__main__":
    main()
