"""The generate command's work (numpy + onnxruntime; ExecuTorch only for a .pte).

Contract: `run_generate(session, ...)` parses the prompt (text through the character tokenizer,
or comma-separated ids) and the stop characters, opens the draft session, checks everything
before generating (bad ids, lengths, a draft of another vocabulary: `PsaEdgeError`), then
generates plainly or speculatively, streaming tokens to stdout when asked, and prints the text
with timings and speculative statistics (or JSON). The target session is opened by the caller
(an artifact of either form, or the eager reference of a checkpoint).
"""

from __future__ import annotations

import json
import sys
from psa_edge.errors import SequenceError
from psa_edge.runtime.generate import Sampling, generate
from psa_edge.runtime.session import open_session
from psa_edge.runtime.speculative import (PromptLookupDrafter, SessionDrafter,
                                          speculative_generate)
from psa_edge.tokenizer import decode, encode


def parse_prompt(prompt: str | None, prompt_ids: str | None, vocab_size: int) -> list[int]:
    if (prompt is None) == (prompt_ids is None):
        raise SequenceError("give exactly one of --prompt and --prompt-ids")
    if prompt is not None:
        return encode(prompt, vocab_size)
    try:
        return [int(x) for x in prompt_ids.split(",") if x.strip()]
    except ValueError:
        raise SequenceError(f"--prompt-ids {prompt_ids!r} is not a comma-separated list of "
                            f"integers")


def run_generate(session, label: str, prompt, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                 seed, stop, stream, draft, draft_len, prompt_lookup, threads, as_json) -> dict:
    vocab = session.io.vocab_size
    ids = parse_prompt(prompt, prompt_ids, vocab)
    stops = encode(stop, vocab) if stop else []
    sampling = Sampling(temperature, top_k, top_p, seed)
    if draft is not None and prompt_lookup:
        raise SequenceError("give --draft or --prompt-lookup, not both")
    if draft_len < 1:
        raise SequenceError(f"--draft-len must be >= 1, got {draft_len}")
    drafter = (SessionDrafter(open_session(draft, threads), vocab) if draft is not None
               else PromptLookupDrafter() if prompt_lookup else None)
    on_token = None
    if stream and not as_json:
        def on_token(token: int) -> None:
            sys.stdout.write(decode([token]))
            sys.stdout.flush()
    if drafter is None:
        result = generate(session, ids, max_new_tokens, sampling, stops, on_token)
    else:
        result = speculative_generate(session, drafter, ids, max_new_tokens, draft_len,
                                      sampling, stops, on_token)
    report = {"artifact": label, "backend": session.backend,
              "prompt_ids": ids, "tokens": result.tokens, "text": decode(result.tokens),
              "speculative": None if drafter is None else
              ("prompt-lookup" if prompt_lookup else str(draft)), **result.summary()}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        if stream:
            print()
        else:
            print(report["text"])
        print_summary(report)
    return report


def print_summary(report: dict) -> None:
    decode_rate = report["decode_tokens_per_second"]
    line = (f"[{report['backend']}] {report['prompt_tokens']} prompt tokens, "
            f"{report['new_tokens']} new ({report['stop_reason']}); prefill "
            f"{report['prefill_seconds'] * 1e3:.1f} ms, decode "
            + (f"{decode_rate:.0f} tokens/s" if decode_rate else "-")
            + f", {report['graph_calls']} graph calls")
    if report["speculative"]:
        rate = report["acceptance_rate"]
        line += (f"; speculative ({report['speculative']}): {report['accepted']}/"
                 f"{report['drafted']} drafts accepted"
                 + (f" ({rate:.0%})" if rate is not None else "")
                 + f", {report['tokens_per_target_call']:.2f} tokens per target call")
    print(line, file=sys.stderr)
