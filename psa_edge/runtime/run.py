"""The generate command's work (numpy + onnxruntime; ExecuTorch only for a .pte).

Contract: `run_generate(session, ...)` reads the prompt (`Prompt`: text or a file, encoded with
the model's own tokenizer; comma-separated ids; or a chat message or conversation rendered by
the model's chat template), checks everything before generating (bad ids,
lengths, a draft of another vocabulary: `PsaEdgeError`), then generates plainly or
speculatively until the end-of-text token, a stop string or the token budget. With `stream` it
prints the text as it grows (a character split over several byte-level tokens is printed once
it is whole); otherwise the text once, cut before a stop string. Timings and speculative
statistics go to stderr (or everything, as JSON, to stdout). The target session is opened by the
caller (an artifact of either form, or the eager reference of a checkpoint).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from psa_edge.errors import SequenceError
from psa_edge.io import not_a_file
from psa_edge.runtime.generate import Sampling, Stop, generate
from psa_edge.runtime.session import open_session
from psa_edge.runtime.speculative import (PromptLookupDrafter, SessionDrafter,
                                          speculative_generate)

# A prompt far longer than any artifact's positions (LENGTH_MAX tokens of a few bytes each) is
# refused by size, before it is read: a 1 GB sparse file, or /dev/zero through a symlink.
MAX_PROMPT_BYTES = 64 << 20


@dataclass(frozen=True)
class Prompt:
    """Where the prompt comes from: exactly one of text, a text file, token ids (comma-
    separated), a chat message, or a chat file (a JSON list of {"role", "content"}), the last
    two rendered by the model's chat template."""
    text: str | None = None
    file: Path | None = None
    ids: str | None = None
    chat: str | None = None
    chat_file: Path | None = None

    def tokens(self, tokenizer) -> list[int]:
        given = [x is not None for x in (self.text, self.file, self.ids, self.chat,
                                         self.chat_file)]
        if sum(given) != 1:
            raise SequenceError("give exactly one of --prompt, --prompt-file, --prompt-ids, "
                                "--chat and --chat-file")
        if self.ids is not None:
            try:
                return [int(x) for x in self.ids.split(",")]
            except ValueError:
                raise SequenceError(f"--prompt-ids {self.ids!r} is not a comma-separated list "
                                    f"of integers")
        text = self.text
        if self.file is not None:
            text = read_prompt_file(Path(self.file), "--prompt-file")
        elif self.chat is not None:
            text = tokenizer.render_chat([{"role": "user", "content": utf8(self.chat)}])
        elif self.chat_file is not None:
            try:
                messages = json.loads(read_prompt_file(Path(self.chat_file), "--chat-file"))
            except (ValueError, RecursionError) as exc:
                raise SequenceError(f"--chat-file {self.chat_file} is not JSON "
                                    f"({str(exc)[:80]})")
            text = tokenizer.render_chat(messages)
        ids = tokenizer.encode(utf8(text))
        if not ids:
            raise SequenceError("the prompt is empty: it has no tokens to start from")
        return ids


def utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (surrogates)
        raise SequenceError("the prompt is not UTF-8 text")
    return text


def read_prompt_file(path: Path, option: str) -> str:
    """A prompt file's text: a regular file (not a FIFO, a device or a directory, which are
    refused before they are opened) of at most MAX_PROMPT_BYTES, UTF-8."""
    if (problem := not_a_file(path)) is not None:
        raise SequenceError(f"{option} {path} {problem}")
    size = path.stat().st_size
    if size > MAX_PROMPT_BYTES:
        raise SequenceError(f"{option} {path} holds {size:,} bytes, more than the "
                            f"{MAX_PROMPT_BYTES:,} a prompt may")
    try:
        return path.read_bytes()[:MAX_PROMPT_BYTES].decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SequenceError(f"cannot read {option} {path}: {str(exc)[:120]}")


def cut(text: str, strings) -> str:
    """The text before the first stop string in it."""
    ends = [text.index(s) for s in strings if s in text]
    return text[:min(ends)] if ends else text


class Printer:
    """Streams the generated text: the whole decoded text is re-read at every token, and what
    is new is printed once it ends in a whole character; the last characters, which could begin
    a stop string, wait until they cannot."""

    def __init__(self, tokenizer, strings):
        self.tokenizer, self.strings, self.tokens, self.shown = tokenizer, strings, [], 0
        self.hold = max((len(s) for s in strings), default=1) - 1

    def __call__(self, token: int) -> None:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens)
        if not text.endswith("\ufffd"):
            kept = cut(text, self.strings)
            self.write(kept if len(kept) < len(text) else kept[:len(kept) - self.hold])

    def write(self, text: str) -> None:
        if len(text) > self.shown:
            sys.stdout.write(text[self.shown:])
            sys.stdout.flush()
            self.shown = len(text)

    def finish(self, text: str) -> None:
        self.write(text)
        print()


def run_generate(session, label: str, prompt: Prompt, max_new_tokens, temperature, top_k,
                 top_p, seed, stop, stream, draft, draft_len, prompt_lookup, threads,
                 as_json) -> dict:
    tokenizer = session.tokenizer
    vocab = session.io.vocab_size
    if any(s == "" for s in stop or ()):  # "" is in every text: it would stop at once
        raise SequenceError("--stop takes a non-empty string")
    ids = prompt.tokens(tokenizer)
    eos = session.manifest["config"].get("eos_token_id")
    stops = Stop(frozenset({eos} if isinstance(eos, int) else set(eos or ())), tuple(stop or ()),
                 tokenizer.decode)
    sampling = Sampling(temperature, top_k, top_p, seed)
    if draft is not None and prompt_lookup:
        raise SequenceError("give --draft or --prompt-lookup, not both")
    if draft_len < 1:
        raise SequenceError(f"--draft-len must be >= 1, got {draft_len}")
    drafter = (SessionDrafter(open_session(draft, threads), vocab) if draft is not None
               else PromptLookupDrafter() if prompt_lookup else None)
    on_token = Printer(tokenizer, stops.strings) if stream and not as_json else None
    if drafter is None:
        result = generate(session, ids, max_new_tokens, sampling, stops, on_token)
    else:
        result = speculative_generate(session, drafter, ids, max_new_tokens, draft_len,
                                      sampling, stops, on_token)
    text = cut(tokenizer.decode(result.tokens), stops.strings)
    report = {"artifact": label, "backend": session.backend, "prompt_ids": ids,
              "tokens": result.tokens, "text": text,
              "speculative": None if drafter is None else
              ("prompt-lookup" if prompt_lookup else str(draft)), **result.summary()}
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        on_token.finish(text) if on_token else print(text)
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
