"""The tokenizer that travels with a model (numpy-free; Hugging Face `tokenizers`, no torch).

Contract: a `Tokenizer` is a Hugging Face `tokenizer.json` and the special token ids read from it.
Every model has one: a text model a byte-level BPE (`train_bpe`, trained on its corpus, with
`<|endoftext|>` between documents), an induction-task model a character map (`chars`: token id i
is the i-th character of the base64 alphabet for i < 64, the CJK ideograph U+4E00 + (i - 64)
beyond), with a `Fuse` decoder so that every decoder reads the ids back as the same text. It is
stored in the checkpoint as the JSON text and written beside every artifact as `tokenizer.json`
and `tokenizer_config.json` (`write`), which Hugging Face `tokenizers`, `PreTrainedTokenizerFast`,
ExecuTorch's `TextLLMRunner` and psa-edge's runtime all read. `encode` refuses text the
vocabulary cannot represent (a character tokenizer would drop it silently).

A tokenizer may carry the model's chat template (a Jinja template, as Hugging Face's
tokenizer_config.json `chat_template` and GGUF's `tokenizer.chat_template` hold it): it travels
in the checkpoint and in every artifact's tokenizer_config.json, and `render_chat(messages)`
renders a conversation with it as transformers' `apply_chat_template` does (a sandboxed
environment, `trim_blocks`, `lstrip_blocks`, the generation prompt added). jinja2 is imported
only to render.
"""

from __future__ import annotations

import json
from pathlib import Path

from psa_edge.errors import SequenceError, TokenizerError

BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
CJK_START = 0x4E00
MAX_CHAR_VOCAB = len(BASE64) + (0x9FFF - CJK_START + 1)
EOS = "<|endoftext|>"
BYTE_ALPHABET = 256  # a byte-level BPE starts from every byte
FILES = ("tokenizer.json", "tokenizer_config.json")


def token_char(token_id: int) -> str:
    if token_id < len(BASE64):
        return BASE64[token_id]
    return chr(CJK_START + token_id - len(BASE64))


class Tokenizer:
    def __init__(self, json_text: str, chat_template: str | None = None):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self.hf = HFTokenizer.from_str(json_text)
        except Exception as exc:  # noqa: BLE001 - the Rust library raises its own classes
            raise TokenizerError(f"not a Hugging Face tokenizer.json ({str(exc)[:120]})")
        if chat_template is not None and not isinstance(chat_template, str):
            raise TokenizerError(f"a chat template is Jinja text, not a "
                                 f"{type(chat_template).__name__}")
        self.json, self.chat_template = json_text, chat_template or None
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        self.eos_id = self.hf.token_to_id(EOS)
        self.lossless = (json.loads(json_text).get("decoder") or {}).get("type") == "ByteLevel"

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        from psa_edge.io import not_a_file

        if (problem := not_a_file(path)) is not None:
            raise TokenizerError(f"tokenizer {path} {problem}")
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"cannot read tokenizer {path}: {exc}")
        config = Path(path).with_name(FILES[1])
        template = None
        if not_a_file(config) is None:  # a save_pretrained folder's: its chat template
            template = chat_template_of(config.read_bytes(), config)
        return cls(text, template)

    @classmethod
    def chars(cls, vocab_size: int) -> "Tokenizer":
        """The character tokenizer of an induction-task vocabulary."""
        if not 1 <= vocab_size <= MAX_CHAR_VOCAB:
            raise TokenizerError(f"vocabulary {vocab_size} does not fit the character "
                                 f"tokenizer (1..{MAX_CHAR_VOCAB})")
        model = {"type": "BPE", "dropout": None, "unk_token": None,
                 "continuing_subword_prefix": None, "end_of_word_suffix": None,
                 "fuse_unk": False, "byte_fallback": False,
                 "vocab": {token_char(i): i for i in range(vocab_size)}, "merges": []}
        return cls(json.dumps({"version": "1.0", "truncation": None, "padding": None,
                               "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                               "post_processor": None, "decoder": {"type": "Fuse"},
                               "model": model}, ensure_ascii=False))

    def encode(self, text: str) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if not self.lossless and self.decode(ids) != text:
            bad = next((ch for ch in text if self.hf.token_to_id(ch) is None), text[:20])
            raise SequenceError(f"{bad!r} is not in the model's {self.vocab_size}-token "
                                f"vocabulary")
        return ids

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def config(self, max_length: int) -> dict:
        """tokenizer_config.json: what `PreTrainedTokenizerFast` (AutoTokenizer) reads."""
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
                  "clean_up_tokenization_spaces": False, "add_bos_token": False,
                  "add_eos_token": False}
        if self.eos_id is not None:
            config["eos_token"] = EOS
        if self.chat_template:
            config["chat_template"] = self.chat_template
        return config

    def render_chat(self, messages) -> str:
        """The prompt text of a conversation (a list of {"role", "content"} strings) rendered
        by the model's chat template, ending with the generation prompt."""
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not self.chat_template:
            raise SequenceError("the model has no chat template (give --prompt instead)")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            raise SequenceError("a conversation is a non-empty list of {\"role\": ..., "
                                "\"content\": ...} strings")

        def raise_exception(message):
            raise TemplateError(message)

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                    extensions=["jinja2.ext.loopcontrols"])
        environment.globals["raise_exception"] = raise_exception
        try:
            return environment.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, bos_token="",
                eos_token=EOS if self.eos_id is not None else "")
        except TemplateError as exc:
            raise SequenceError(f"the chat template cannot render this conversation: "
                                f"{str(exc)[:160]}")

    def write(self, folder: Path, max_length: int) -> None:
        """tokenizer.json and tokenizer_config.json into a folder being built."""
        from psa_edge.io import write_text

        write_text(folder / FILES[0], self.json)
        write_text(folder / FILES[1], json.dumps(self.config(max_length), indent=2) + "\n")


def chat_template_of(data: bytes, where) -> str | None:
    """The `chat_template` string of a tokenizer_config.json's bytes (None when it has none)."""
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TokenizerError(f"{where} is not valid JSON ({str(exc)[:80]})")
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{where}: chat_template is not a string (a list of named "
                             f"templates is not read)")
    return template


def train_bpe(documents, vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` tokens (the 256 bytes, `<|endoftext|>`, merges) trained
    on an iterable of texts, as GPT-2's: no normalization, no prefix space."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < BYTE_ALPHABET + 1:
        raise TokenizerError(f"--vocab-size {vocab_size} is below the byte alphabet plus "
                             f"{EOS} ({BYTE_ALPHABET + 1})")
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    hf.train_from_iterator(documents, trainer=trainer)
    return Tokenizer(hf.to_str())
