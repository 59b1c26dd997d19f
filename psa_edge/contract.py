"""The graph I/O contract, in one place: state fields, tensor names and shapes, the manifest's
`io` block and the files of an artifact folder (docs/spec.md §4, §8). numpy only, no torch.

Export writes what this module derives; the runtime, the backends and the checks read it back
with `GraphIO.from_manifest`, which recomputes the block from the manifest's config and refuses
an artifact whose recorded block differs (an artifact of an older psa-edge, or a hand-edited
manifest). Nothing else spells a tensor name or a state shape.

Forms:
- `explicit-state`: `(input_ids [1, S], *past) -> (logits [1, S, V], *present, *raw)`; per
  layer i the inputs `past_key_values.{i}.key / .value / .prev_key / .prev_query` (in that
  order; the slots only where that gamma is non-zero), the outputs `present.{i}.key / .value`,
  then one `present.raw_key` `[layers, Hkv, S, dh]` (and `present.raw_query`) per sheared
  stream, the layers stacked on dim 0; the last row of layer i's part is its next slot.
- `runner`: `forward(tokens [1, S], input_pos [1]) -> logits [1, S, V]`, the caches and the
  raw-key window inside the program as mutable buffers (`buffers`): a static
  `[1, Hkv, max_seq_len, dh]` key and value cache per layer, and per sheared stream a ring of
  the raw keys (queries) of the last `window` positions, from which the program takes the
  previous-key slot of whatever position it is asked to continue from.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import numpy as np

from psa_edge.errors import ArtifactError

State = dict[str, np.ndarray]

CACHE_FIELDS = ("key", "value")
# Each slot and the raw stream it is read from: the last row of the chunk's raw stream.
RAW_OF_SLOT = {"prev_key": "raw_key", "prev_query": "raw_query"}
FORMS = ("explicit-state", "runner")
# Target -> backend that runs it, and the model file inside the artifact folder.
BACKENDS = {"onnx": "onnxruntime", "xnnpack": "executorch", "portable": "executorch"}
MODEL_FILES = {"onnx": "model.onnx", "xnnpack": "model.pte", "portable": "model.pte"}
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
# Raw positions a runner-form program keeps: more than any speculative draft (rollback reach).
RUNNER_WINDOW = 64
FLOAT_BYTES = 4


def gammas(config: Mapping) -> tuple[float, float]:
    return float(config["gamma_q"]), float(config["gamma_k"])


def same_architecture(a: Mapping, b: Mapping) -> bool:
    """Whether two model configs differ at most in the shear (gamma_q, gamma_k, variant)."""
    strip = lambda cfg: {k: v for k, v in cfg.items()  # noqa: E731
                         if k not in ("gamma_q", "gamma_k", "variant")}
    return strip(a) == strip(b)


def runner_methods(config: Mapping, max_seq_len: int) -> dict:
    """The constant methods ExecuTorch's LLM runner reads from a runner-form program."""
    # A vocabulary without an end-of-sequence token gets an id no model emits (vocab_size):
    # the runner's default (id 0) would stop on an ordinary token.
    eos = config.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [config["vocab_size"] if eos is None else eos]
    bos = config.get("bos_token_id")
    return {"get_max_seq_len": max_seq_len, "get_max_context_len": max_seq_len,
            "get_vocab_size": config["vocab_size"], "use_kv_cache": True,
            "enable_dynamic_shape": True, "get_bos_id": 0 if bos is None else bos,
            "get_eos_ids": eos_ids}


@dataclass(frozen=True)
class GraphIO:
    """The I/O of one exported graph form, derived from a model config and a max length."""

    form: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_seq_len: int
    gamma_q: float
    gamma_k: float

    @classmethod
    def from_config(cls, config: Mapping, max_seq_len: int,
                    form: str = "explicit-state") -> "GraphIO":
        if form not in FORMS:
            raise ArtifactError(f"unknown graph form {form!r}; psa-edge knows {', '.join(FORMS)}")
        gamma_q, gamma_k = gammas(config)
        return cls(form, int(config["num_hidden_layers"]), int(config["num_attention_heads"]),
                   int(config["num_key_value_heads"]),
                   int(config["hidden_size"]) // int(config["num_attention_heads"]),
                   int(config["vocab_size"]), int(max_seq_len), gamma_q, gamma_k)

    @classmethod
    def from_manifest(cls, manifest: Mapping) -> "GraphIO":
        """The contract of an artifact, refused when its manifest's io block is not the one
        its config implies."""
        io = cls.from_config(manifest["config"], manifest["max_seq_len"],
                             manifest.get("form", "explicit-state"))
        if manifest.get("io") != io.manifest_block():
            raise ArtifactError("the artifact's graph I/O is not the one this psa-edge exports "
                                "for its config (an older psa-edge?); export it again")
        return io

    # -- fields -------------------------------------------------------------------------------

    @cached_property
    def slot_fields(self) -> tuple[str, ...]:
        return tuple(f for f, gamma in (("prev_key", self.gamma_k), ("prev_query", self.gamma_q))
                     if gamma != 0)

    @cached_property
    def state_fields(self) -> tuple[str, ...]:
        """The per-layer state tensors of the explicit-state form, in I/O order."""
        return CACHE_FIELDS + self.slot_fields

    @cached_property
    def raw_fields(self) -> tuple[str, ...]:
        """One raw stream per sheared stream, the layers stacked on dim 0."""
        return tuple(RAW_OF_SLOT[f] for f in self.slot_fields)

    @property
    def window(self) -> int:
        """Raw positions a runner-form program keeps (0 without a shear)."""
        return min(RUNNER_WINDOW, self.max_seq_len) if self.slot_fields else 0

    # -- names ----------------------------------------------------------------------------------

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        if self.form == "runner":
            return ("tokens", "input_pos")
        return ("input_ids",) + tuple(name for _, name in self.state_io)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        if self.form == "runner":
            return ("logits",)
        return (("logits",) + tuple(name for _, _, name in self.cache_io)
                + tuple(name for _, name in self.raw_io))

    @cached_property
    def state_io(self) -> tuple[tuple[str, str], ...]:
        """(state key, graph input name) per layer and state field, in input order."""
        return tuple((f"{i}.{f}", f"past_key_values.{i}.{f}")
                     for i in range(self.num_layers) for f in self.state_fields)

    @cached_property
    def cache_io(self) -> tuple[tuple[str, str, str], ...]:
        """(state key, graph input name, graph output name) of the KV caches."""
        return tuple((f"{i}.{f}", f"past_key_values.{i}.{f}", f"present.{i}.{f}")
                     for i in range(self.num_layers) for f in CACHE_FIELDS)

    @cached_property
    def slot_io(self) -> tuple[tuple[str, str, int], ...]:
        """(slot state key, raw stream, layer): the slot's next value is the last row of that
        layer's part of the stream."""
        return tuple((f"{i}.{f}", RAW_OF_SLOT[f], i) for i in range(self.num_layers)
                     for f in self.slot_fields)

    @cached_property
    def slot_keys(self) -> tuple[str, ...]:
        return tuple(key for key, _, _ in self.slot_io)

    @cached_property
    def raw_io(self) -> tuple[tuple[str, str], ...]:
        """(raw stream, graph output name)."""
        return tuple((f, f"present.{f}") for f in self.raw_fields)

    # -- shapes ---------------------------------------------------------------------------------

    def heads(self, field: str) -> int:
        return self.num_heads if field.endswith("query") else self.num_kv_heads

    def shape(self, field: str, length: int) -> tuple[int, int, int, int]:
        """Shape of a state tensor after `length` positions (caches grow, slots do not)."""
        return (1, self.heads(field), length if field in CACHE_FIELDS else 1, self.head_dim)

    @cached_property
    def buffers(self) -> dict[str, tuple[int, ...]]:
        """The runner form's mutable buffers: static caches and the raw windows."""
        out = {}
        for i in range(self.num_layers):
            for f in CACHE_FIELDS:
                out[f"cache_{f}_{i}"] = self.shape(f, self.max_seq_len)
            for f in self.raw_fields:  # one spare row takes the chunk's older positions
                out[f"{f}_{i}"] = (1, self.heads(f), self.window + 1, self.head_dim)
        return out

    def empty_state(self) -> State:
        """The P = 0 state: empty caches, zero slots (the causal zero initial state)."""
        return {key: np.zeros(self.shape(key.split(".")[1], 0), np.float32)
                for key, _ in self.state_io}

    def state_bytes(self, length: int) -> dict:
        """Bytes of the state after `length` positions: the KV cache (which must equal the
        gamma = 0 twin's) and what PSA adds beside it, constant in length."""
        per_position = self.num_layers * len(CACHE_FIELDS) * self.num_kv_heads * self.head_dim
        if self.form == "runner":  # static: the whole cache exists from the start
            extra = sum(int(np.prod(s)) for n, s in self.buffers.items() if n.startswith("raw"))
            return {"kv_cache_bytes": FLOAT_BYTES * per_position * self.max_seq_len,
                    "extra_bytes": FLOAT_BYTES * extra}
        extra = sum(int(np.prod(self.shape(k.split(".")[1], 1))) for k in self.slot_keys)
        return {"kv_cache_bytes": FLOAT_BYTES * per_position * length,
                "extra_bytes": FLOAT_BYTES * extra}

    # -- manifest ---------------------------------------------------------------------------

    def manifest_block(self) -> dict:
        block = {"inputs": list(self.input_names), "outputs": list(self.output_names)}
        if self.form == "runner":
            block.update(buffers={k: list(v) for k, v in self.buffers.items()},
                         window=self.window)
        else:
            block.update(state_fields=list(self.state_fields), raw_fields=list(self.raw_fields))
        return block


def slots_from(raw: State, io: GraphIO, row: int = -1) -> State:
    """The slots after position `row` of a chunk (default its last, the next slots): that row
    of each layer's part of the stacked raw streams, `[1, H, 1, d]`."""
    return {key: np.ascontiguousarray(raw[stream][layer:layer + 1, :, row, None])
            for key, stream, layer in io.slot_io}
