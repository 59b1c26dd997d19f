"""A llama.cpp GGUF file in: the Llama config, the weights and the tokenizer it holds, as
`import_hf` takes them from a Hugging Face folder (docs/reference/hf.md). numpy and the `gguf`
package (llama.cpp's own reader), no torch.

Contract: `read_gguf(path)` returns a `GgufModel`: `config` (the Hugging Face Llama config
fields, BOS and EOS ids among them), `weights()` (Hugging Face names -> float32 arrays,
dequantized from F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K or Q6_K by the gguf package, read
when asked), `tokenizer` (a tokenizer.json text rebuilt from the metadata: vocabulary, merges,
special tokens, the pre-tokenizer llama.cpp names) and `chat` (the chat template and
add_bos). What psa-edge's model does not implement
(another architecture, RoPE scaling, a head size other than hidden / heads, a tokenizer model
other than byte-level BPE, a pre-tokenizer it cannot rebuild, another tensor type) is refused
in one line naming it, as is a file the gguf package cannot read.

llama.cpp's converter permutes the rows of the query and key projections so that its RoPE
rotates adjacent pairs; Hugging Face's rotates halves. `unpermute` undoes it (per head: rows
(j, 2) -> (2, j)), so the weights compute what the source model computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from psa_edge.errors import CheckpointError, ConfigError

MAGIC = b"GGUF"
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
# GGUF tensor name -> Hugging Face name ({i}: the layer).
NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
         "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
               "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# The pre-tokenizers rebuilt, by llama.cpp's `tokenizer.ggml.pre` name: GPT-2's byte-level
# split, and SmolLM's, which first splits every digit apart (llama.cpp: \p{N}, then GPT-2's).
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
PRE_TOKENIZERS = {
    "default": BYTE_LEVEL, "gpt2": BYTE_LEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]}}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types that are matched whole in text


@dataclass
class GgufModel:
    path: Path
    config: dict
    tokenizer: str
    chat: dict = field(default_factory=dict)
    reader: object = None

    def weights(self) -> dict[str, np.ndarray]:
        """Hugging Face name -> float32 weights (read once the config has been checked)."""
        return {hf_name(t.name, self.path): weights_of(t, self.config, self.path)
                for t in self.reader.tensors}


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read_gguf(path: Path) -> GgufModel:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        meta = {name: f.contents() for name, f in reader.fields.items()}
    except Exception as exc:  # noqa: BLE001 - the reader raises ValueError, struct errors...
        raise CheckpointError(f"{path} is not a GGUF file the gguf package reads "
                              f"({str(exc)[:120]})")
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ConfigError(f"{path}: architecture {arch!r} is not llama; psa-edge imports "
                          f"Llama models only")
    tokenizer = rebuild_tokenizer(meta, path)
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    if len(shapes.get("token_embd.weight", ())) != 2:
        raise ConfigError(f"{path} has no 2-D token_embd.weight")
    config = llama_config(meta, shapes["token_embd.weight"][1], set(shapes), path)
    chat = {"chat_template": meta.get("tokenizer.chat_template"),
            "add_bos": bool(meta.get("tokenizer.ggml.add_bos_token", False))}
    return GgufModel(path, config, tokenizer, chat, reader)


def llama_config(meta: dict, vocab_size: int, names: set, path: Path) -> dict:
    """The Hugging Face Llama config fields the metadata gives (`llama.*`); the vocabulary is
    the embedding's rows (a model may have more than its tokenizer's tokens)."""
    def get(key, default=None):
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise ConfigError(f"{path} has no llama.{key}")
        return value

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    head_dim = hidden // heads if isinstance(heads, int) and heads > 0 else None
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        if meta.get(f"llama.{key}", head_dim) != head_dim:
            raise ConfigError(f"{path}: llama.{key} = {meta[f'llama.{key}']} is not hidden / "
                              f"heads ({head_dim}); psa-edge's model does not implement it")
    if meta.get("llama.rope.scaling.type", "none") not in ("none", None):
        raise ConfigError(f"{path}: rope scaling {meta['llama.rope.scaling.type']!r} is not "
                          f"implemented by psa-edge's model")
    return {"vocab_size": vocab_size, "hidden_size": hidden,
            "intermediate_size": get("feed_forward_length"),
            "num_hidden_layers": get("block_count"), "num_attention_heads": heads,
            "num_key_value_heads": get("attention.head_count_kv", heads),
            "max_position_embeddings": get("context_length"),
            "rms_norm_eps": decimal(get("attention.layer_norm_rms_epsilon")),
            "rope_theta": decimal(get("rope.freq_base", 10000.0)),
            "tie_word_embeddings": "output.weight" not in names,
            "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": meta.get("tokenizer.ggml.eos_token_id")}


def decimal(value) -> float:
    """A float32 metadata value as the shortest decimal that reads back as it (1e-05, not
    9.999999747378752e-06): the value the source config wrote."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def hf_name(name: str, path: Path) -> str:
    if name in NAMES:
        return NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() \
            and parts[2] in LAYER_NAMES and parts[3] == "weight":
        return f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}.weight"
    raise ConfigError(f"{path}: tensor {name!r} is not one of a Llama model's")


def weights_of(tensor, config: dict, path: Path) -> np.ndarray:
    """The tensor dequantized to float32 `[rows, columns]` (GGUF lists its dims reversed), the
    query and key rows in Hugging Face's order."""
    from gguf.quants import dequantize

    kind = tensor.tensor_type.name
    if kind not in TYPES:
        raise ConfigError(f"{path}: tensor {tensor.name} is {kind}; psa-edge reads "
                          f"{', '.join(TYPES)}")
    shape = tuple(int(d) for d in reversed(tensor.shape))
    values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
    if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = config["num_attention_heads" if "attn_q" in tensor.name
                       else "num_key_value_heads"]
        values = unpermute(values, heads)
    return values


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's query / key row permutation: per head, `[j, 2]` pairs back to
    `[2, j]` halves."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def rebuild_tokenizer(meta: dict, path: Path) -> str:
    """tokenizer.json text of the file's byte-level BPE."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ConfigError(f"{path}: tokenizer model {model!r} is not byte-level BPE (gpt2); "
                          f"psa-edge rebuilds that one only")
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ConfigError(f"{path}: pre-tokenizer {pre!r} is not one psa-edge rebuilds "
                          f"({', '.join(PRE_TOKENIZERS)})")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    kinds = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = meta.get("tokenizer.ggml.merges") or []
    if not tokens or len(kinds) != len(tokens):
        raise ConfigError(f"{path} has no vocabulary (tokenizer.ggml.tokens / token_type)")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": k == CONTROL}
             for i, (t, k) in enumerate(zip(tokens, kinds)) if k in (CONTROL, USER_DEFINED)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[pre], "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]}}
    return json.dumps(tokenizer, ensure_ascii=False)
