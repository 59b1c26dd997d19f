"""The character tokenizer of psa-edge models (no torch): one character per token id.

The induction tasks have no text, only token ids; ExecuTorch's LLM runner and a prompt on the
command line need a tokenizer all the same. Token id i is the i-th character of the base64
alphabet for i < 64 (so ids of the default 64-token model read as letters and digits), and the
CJK ideograph U+4E00 + (i - 64) beyond. `write_hf_tokenizer` writes the same map as a Hugging
Face `tokenizer.json` (a BPE model without merges), the format the runner loads.
"""

from __future__ import annotations

import json
from pathlib import Path

from psa_edge.errors import SequenceError
from psa_edge.io import write_text

BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
CJK_START = 0x4E00
MAX_VOCAB = len(BASE64) + (0x9FFF - CJK_START + 1)


def token_char(token_id: int) -> str:
    if token_id < len(BASE64):
        return BASE64[token_id]
    return chr(CJK_START + token_id - len(BASE64))


def char_token(ch: str) -> int:
    if ch in BASE64:
        return BASE64.index(ch)
    return ord(ch) - CJK_START + len(BASE64) if ord(ch) >= CJK_START else -1


def encode(text: str, vocab_size: int) -> list[int]:
    ids = [char_token(ch) for ch in text]
    for ch, token in zip(text, ids):
        if not 0 <= token < vocab_size:
            raise SequenceError(f"character {ch!r} is not in the {vocab_size}-token vocabulary")
    return ids


def decode(ids) -> str:
    return "".join(token_char(int(i)) for i in ids)


def write_hf_tokenizer(path: str | Path, vocab_size: int) -> None:
    if vocab_size > MAX_VOCAB:
        raise SequenceError(f"vocabulary {vocab_size} exceeds the character tokenizer's "
                            f"{MAX_VOCAB}")
    model = {"type": "BPE", "dropout": None, "unk_token": None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
             "byte_fallback": False,
             "vocab": {token_char(i): i for i in range(vocab_size)}, "merges": []}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                 "normalizer": None, "pre_tokenizer": None, "post_processor": None,
                 "decoder": None, "model": model}
    write_text(path, json.dumps(tokenizer, ensure_ascii=False))
