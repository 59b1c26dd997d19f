"""The graph I/O contract, in one place: state fields, tensor names and shapes, the manifest's `io`
block and the files of an artifact folder (docs/reference/spec.md §4, §8). numpy only, no torch.

Export writes what this module derives; the runtime, the backends and the checks read it back
with `GraphIO.from_manifest`, which recomputes the block from the manifest's config and refuses
an artifact whose recorded block differs (an artifact of an older psa-edge, or a hand-edited
manifest). Nothing else spells a tensor name or a state shape.

Graph forms are registered objects (`register_form`, looked up by `get_form`): one class per
form says its state, its tensor names and shapes, the targets that build it, the torch half
the exporter builds it with and the session that runs it, so nothing outside this registry
compares a form's name. The four psa-edge ships:
- `explicit-state`: `(input_ids [1, S], *past) -> (logits [1, S, V], *present, *raw)`; per
  layer i the inputs `past_key_values.{i}.key / .value / .prev_key / .prev_query` (in that
  order; the slots only where that gamma is non-zero), the outputs `present.{i}.key / .value`,
  then one `present.raw_key` `[layers, Hkv, S, dh]` (and `present.raw_query`) per sheared
  stream, the layers stacked on dim 0; the last row of layer i's part is its next slot.
- `runner`: `forward(tokens [1, S], input_pos [1]) -> logits [1, S, V]`, the caches and the
  raw-key window inside the program as mutable buffers (`buffers`): a static
  `[1, max_seq_len, Hkv, dh]` key and value cache per layer, and per sheared stream a ring of
  the raw keys (queries) of the last `window` positions, from which the program takes the
  previous-key slot of whatever position it is asked to continue from.
- `fused`: `(input_ids [1, S], input_pos [1], logits_to_keep [1], *past) -> (logits
  [1, R, V], *present, *raw)`: static caches `[1, Hkv, max_seq_len, dh]`, slots and raw
  streams `[1, S or 1, heads dh]` (`shape`); the logits of the last R = logits_to_keep rows
  only (0: all S), as Hugging Face's `logits_to_keep`.
- `raw-key`: plain Llama's I/O, `(input_ids, attention_mask, position_ids, *past) -> (logits,
  *present)` with `past_key_values.{i}.key / .value` and `present.{i}.key / .value` only: the
  caches hold raw post-RoPE keys and the graph shears them (gamma_q = 0 only), so stock
  clients (optimum, onnxruntime-genai) feed it as they feed a Llama.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import numpy as np

from psa_edge import is_integer, is_number
from psa_edge.errors import ArtifactError, ConfigError

State = dict[str, np.ndarray]

CACHE_FIELDS = ("key", "value")
# Each slot and the raw stream it is read from: the last row of the chunk's raw stream.
RAW_OF_SLOT = {"prev_key": "raw_key", "prev_query": "raw_query"}
# Target -> backend that runs it, and the model file inside the artifact folder.
BACKENDS = {"xnnpack": "executorch", "portable": "executorch", "onnx": "onnxruntime"}
MODEL_FILES = {"xnnpack": "model.pte", "portable": "model.pte", "onnx": "model.onnx"}
# An ONNX graph's weights, as external data beside it: protobuf's 2 GB limit does not bind, and
# ONNX Runtime maps the file instead of parsing a copy (a SmolLM2-135M session held 1.26 GB
# loaded from one file's bytes, 0.60 GB from this layout; docs/results/real-model.md).
ONNX_DATA = "model.onnx.data"
# The `--quantize` schemes an artifact may be built with (its manifest's `quantization.scheme`).
SCHEMES = ("int8", "int8-dynamic", "int8-block", "int4")
MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
# Raw positions a runner-form program keeps: more than any speculative draft (rollback reach).
RUNNER_WINDOW = 64
FLOAT_BYTES = 4


# What a config may say before anything is allocated for it: each a type and a range. The size
# limits are far beyond psa-edge's presets (psa-92m: vocab 8192, hidden 768, 12 layers) and keep
# a corrupt or hostile file from asking for terabytes.
INT_FIELDS = {"vocab_size": (1, 1 << 20), "hidden_size": (2, 1 << 15),
              "intermediate_size": (1, 1 << 17), "num_hidden_layers": (1, 256),
              "num_attention_heads": (1, 1024), "num_key_value_heads": (1, 1024),
              "max_position_embeddings": (1, 1 << 20)}
FLOAT_FIELDS = {"rms_norm_eps": (0.0, 1.0), "rope_theta": (0.0, 1e12), "gamma_q": (0.0, 100.0),
                "gamma_k": (0.0, 100.0)}
# An upper bound of the config's parameters (untied, without GQA): Llama 3.2 1B counts 1.6 B by
# it, Qwen2.5 1.5B 2.1 B. 16 GB of fp32 weights: past the edge models psa-edge is for.
MAX_PARAMETERS = 4_000_000_000


def check_threads(threads) -> None:
    """Refuse a thread count a runtime cannot take (ExecuTorch aborts on < 1, a pool far larger
    than the machine hangs)."""
    limit = 4 * (os.cpu_count() or 1)
    if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= limit):
        raise ConfigError(f"threads must be an integer in [1, {limit}], got {threads!r}")


def check_config(config: Mapping) -> None:
    """Types, ranges and size of a model config (`ArtifactError`/`ConfigError` subclasses of
    PsaEdgeError name the field and the limit)."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"the config is a {type(config).__name__}, not an object")
    for name, (low, high) in INT_FIELDS.items():
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config field {name} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ConfigError(f"config field {name} = {value} is outside [{low}, {high}]")
    for name, (low, high) in FLOAT_FIELDS.items():
        value = config.get(name)
        if not is_number(value, low, high):
            raise ConfigError(f"config field {name} must be a number in [{low:g}, {high:g}], "
                              f"got {value!r}")
    if not low_exclusive(config["rms_norm_eps"]) or not low_exclusive(config["rope_theta"]):
        raise ConfigError("config fields rms_norm_eps and rope_theta must be positive")
    for name in ("bos_token_id", "eos_token_id"):
        value = config.get(name)
        if value is not None and not is_integer(value, 0, config["vocab_size"] - 1):
            raise ConfigError(f"config field {name} = {value!r} is not a token id of the "
                              f"vocabulary")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ConfigError(f"hidden_size {config['hidden_size']} is not divisible by "
                          f"num_attention_heads {config['num_attention_heads']}")
    if config["num_attention_heads"] % config["num_key_value_heads"]:
        raise ConfigError(f"num_attention_heads {config['num_attention_heads']} is not a "
                          f"multiple of num_key_value_heads {config['num_key_value_heads']}")
    if (config["hidden_size"] // config["num_attention_heads"]) % 2:
        raise ConfigError("head_dim (hidden_size / num_attention_heads) must be even for RoPE")
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    per_layer = 4 * hidden * hidden + 3 * hidden * config["intermediate_size"]
    parameters = 2 * config["vocab_size"] * hidden + layers * per_layer
    if parameters > MAX_PARAMETERS:
        raise ConfigError(f"the config asks for {parameters:,} parameters, more than psa-edge's "
                          f"limit of {MAX_PARAMETERS:,}")


def low_exclusive(value) -> bool:
    return float(value) > 0


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
                    form: str | None = None) -> "GraphIO":
        """`form`: a registered form's name (default `DEFAULT_FORM`)."""
        form = DEFAULT_FORM if form is None else form
        check_config(config)
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) \
                or not 1 <= max_seq_len <= INT_FIELDS["max_position_embeddings"][1]:
            raise ArtifactError(f"max_seq_len {max_seq_len!r} is not a length")
        get_form(form).check(config)
        gamma_q, gamma_k = gammas(config)
        return cls(form, int(config["num_hidden_layers"]), int(config["num_attention_heads"]),
                   int(config["num_key_value_heads"]),
                   int(config["hidden_size"]) // int(config["num_attention_heads"]),
                   int(config["vocab_size"]), int(max_seq_len), gamma_q, gamma_k)

    @classmethod
    def from_manifest(cls, manifest: Mapping) -> "GraphIO":
        """The contract of an artifact, refused when its manifest's io block is not the one
        its config implies."""
        try:
            io = cls.from_config(manifest["config"], manifest["max_seq_len"],
                                 manifest.get("form", DEFAULT_FORM))
        except KeyError as exc:
            raise ArtifactError(f"the manifest has no {exc.args[0]}")
        if manifest.get("io") != io.manifest_block():
            raise ArtifactError("the artifact's graph I/O is not the one this psa-edge exports "
                                "for its config (an older psa-edge?); export it again")
        return io

    @cached_property
    def spec(self) -> GraphForm:
        """The registered form this I/O is of (looked up once: the decode loop reads it)."""
        return get_form(self.form)

    # -- fields -------------------------------------------------------------------------------

    @cached_property
    def slot_fields(self) -> tuple[str, ...]:
        """The previous-key (-query) slots a sheared stream carries; none in a form whose graph
        shears its cached raw keys itself (`GraphForm.slots`)."""
        if not self.spec.slots:
            return ()
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
    def static_cache(self) -> bool:
        """Whether the caches exist at the max length from the start (runner and fused forms)."""
        return self.spec.static_cache

    @property
    def window(self) -> int:
        """Raw positions a runner-form program keeps (0 without a shear)."""
        return min(RUNNER_WINDOW, self.max_seq_len) if self.slot_fields else 0

    # -- names ----------------------------------------------------------------------------------

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        return self.spec.input_names(self)

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return self.spec.output_names(self)

    @cached_property
    def state_io(self) -> tuple[tuple[str, str], ...]:
        """(state key, graph input name) per layer and state field, in input order."""
        return tuple((f"{i}.{f}", self.spec.past_name.format(layer=i, field=f))
                     for i in range(self.num_layers) for f in self.state_fields)

    @cached_property
    def cache_io(self) -> tuple[tuple[str, str, str], ...]:
        """(state key, graph input name, graph output name) of the KV caches."""
        past, present = self.spec.past_name, self.spec.present_name
        return tuple((f"{i}.{f}", past.format(layer=i, field=f),
                      present.format(layer=i, field=f))
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
        """(raw stream, graph output name): stacked streams; in the fused form, one per layer
        ("{layer}.{stream}")."""
        return self.spec.raw_io(self)

    # -- shapes ---------------------------------------------------------------------------------

    def heads(self, field: str) -> int:
        return self.num_heads if field.endswith("query") else self.num_kv_heads

    def shape(self, field: str, length: int) -> tuple[int, ...]:
        """Shape of a state tensor after `length` positions (caches grow, slots do not). The
        fused form's caches are static and its slots and raw streams are `[1, S, heads dh]`,
        the layout of its attention inputs."""
        return self.spec.shape(self, field, length)

    @cached_property
    def buffers(self) -> dict[str, tuple[int, ...]]:
        """The runner form's mutable buffers: static caches `[1, max, Hkv, dh]` (positions before
        heads, the layout of ExecuTorch's llama `update_cache` and `custom_sdpa`) and the raw
        windows."""
        out = {}
        for i in range(self.num_layers):
            for f in CACHE_FIELDS:
                out[f"cache_{f}_{i}"] = (1, self.max_seq_len, self.num_kv_heads, self.head_dim)
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
        extra = self.spec.extra_elements(self)
        if self.static_cache:
            length = self.max_seq_len
        return {"kv_cache_bytes": FLOAT_BYTES * per_position * length,
                "extra_bytes": FLOAT_BYTES * extra}

    def typed_inputs(self) -> list[tuple[str, int, list]]:
        """(name, ONNX element type, shape with dim names) of the fused form's inputs."""
        int64, float32 = 7, 1  # onnx.TensorProto.INT64, FLOAT
        state = [(name, float32, list(self.shape(key.split(".")[1], 1)))
                 for key, name in self.state_io]
        return [("input_ids", int64, [1, "seq_len"]), ("input_pos", int64, [1]),
                ("logits_to_keep", int64, [1])] + state

    def typed_outputs(self) -> list[tuple[str, list]]:
        """(name, shape with dim names) of the fused form's (float) outputs."""
        caches = [(name, list(self.shape(key.split(".")[1], 0)))
                  for key, _, name in self.cache_io]
        raw = [(name, [1, "seq_len", self.heads(stream) * self.head_dim])
               for stream, name in self.raw_io]
        return [("logits", [1, "logit_rows", self.vocab_size])] + caches + raw

    def patterns(self) -> tuple[list[tuple], list[tuple]]:
        """The shape of every input and output, None where a dim is dynamic (chunk or past
        length): what the graph a manifest describes must have."""
        return self.spec.patterns(self)

    def check_signature(self, inputs: list, outputs: list, where: str) -> None:
        """Refuse a graph whose inputs and outputs (shapes: ints, or anything for a dynamic
        dim) are not the ones the manifest's config implies: a lying manifest."""
        for kind, found, wanted in (("inputs", inputs, self.patterns()[0]),
                                    ("outputs", outputs, self.patterns()[1])):
            if len(found) != len(wanted):
                raise ArtifactError(f"{where} has {len(found)} {kind}, its manifest describes "
                                    f"{len(wanted)}")
            for i, (shape, pattern) in enumerate(zip(found, wanted)):
                static = [d if isinstance(d, int) else None for d in shape]
                if len(static) != len(pattern) or any(
                        p is not None and d is not None and d != p
                        for d, p in zip(static, pattern)):
                    raise ArtifactError(f"{where}: {kind[:-1]} {i} has shape {list(shape)}, its "
                                        f"manifest's config implies {list(pattern)}")

    # -- manifest ---------------------------------------------------------------------------

    def manifest_block(self) -> dict:
        return self.spec.manifest_block(self)


# -- graph forms -------------------------------------------------------------------------------

FORMS: dict[str, "GraphForm"] = {}  # name -> the form's one instance, in registration order


def register_form(cls: type) -> type:
    """Class decorator: make a graph form known to export, the runtime, bench and bundle by
    its `name` (ExecuTorch's `@register_attention`, llama.cpp's `@ModelBase.register`)."""
    if not getattr(cls, "name", None) or cls.name in FORMS:
        raise ConfigError(f"a graph form needs a new name, got {getattr(cls, 'name', None)!r}")
    FORMS[cls.name] = cls()
    return cls


def get_form(name) -> "GraphForm":
    """The registered form of that name; `ArtifactError` names the known ones."""
    form = FORMS.get(name) if isinstance(name, str) else None
    if form is None:
        raise ArtifactError(f"unknown graph form {name!r:.40}; psa-edge knows "
                            f"{', '.join(FORMS)}")
    return form


def resolve(path: str):
    """`"package.module:Name"` -> the object, imported when first asked for: a form names its
    torch half and its session without this torch-free layer importing them."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


class GraphForm:
    """A graph form: what its graph takes and returns, who builds it and who runs it. The
    base class is the explicit-state form's I/O; a subclass overrides what differs.

    - `targets`: the `--target`s that build it; `schemes`: the `--quantize` schemes it takes;
    - `exporter`: the torch half (`export/forms.py`), built as `resolve(exporter)(name)`;
    - `sessions`: backend -> (session class, program class), each `"module:Name"`; the
      runtime opens `Session(Program(artifact, threads, profile_prefix, takes_turns))`;
    - `static_cache`: caches exist at the max length from the start;
    - `slots`: a sheared stream carries a previous-key (-query) slot (`GraphIO.slot_fields`);
    - `onnx_clients(io)`: the stock ONNX clients that run its graph as written (the ONNX
      target writes genai_config.json where onnxruntime-genai is one, from `genai_inputs`);
    - `llm_runner`: ExecuTorch's LLM runner (TextLLMRunner, llama_main) loads its `.pte`;
    - `feeds(io, seq_len, past_len)`: the inputs beside the tokens and the state a session
      feeds it (none but in the raw-key form);
    - `check(config)`: refuse a model the form cannot express (`ConfigError`);
    - `suffix`: what `export` adds to a default output folder's name (default: the name)."""

    name = ""
    targets: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ()
    exporter = ""
    sessions: dict[str, tuple[str, str]] = {}
    static_cache = False
    slots = True
    llm_runner = False
    past_name = "past_key_values.{layer}.{field}"
    present_name = "present.{layer}.{field}"
    raw_name = "present.{stream}"

    @property
    def suffix(self) -> str:  # a subclass may set a plain class attribute instead
        return self.name

    def opener(self, backend: str, where: str) -> tuple[type, type]:
        """(session class, program class) that run this form on `backend`."""
        if backend not in self.sessions:
            raise ArtifactError(f"{where}: psa-edge runs no {self.name} graph on {backend!r}")
        session, program = self.sessions[backend]
        return resolve(session), resolve(program)

    def check(self, config: Mapping) -> None:
        pass

    def onnx_clients(self, io: "GraphIO") -> tuple[str, ...]:
        return ()

    def genai_inputs(self, io: "GraphIO") -> dict[str, str]:
        """genai_config.json's `decoder.inputs`: the graph inputs onnxruntime-genai feeds."""
        return {"input_ids": "input_ids",
                "past_key_names": self.past_name.format(layer="%d", field="key"),
                "past_value_names": self.past_name.format(layer="%d", field="value")}

    def feeds(self, io: "GraphIO", seq_len: int, past_len: int) -> State:
        return {}

    def input_names(self, io: "GraphIO") -> tuple[str, ...]:
        return ("input_ids",) + tuple(name for _, name in io.state_io)

    def output_names(self, io: "GraphIO") -> tuple[str, ...]:
        return (("logits",) + tuple(name for _, _, name in io.cache_io)
                + tuple(name for _, name in io.raw_io))

    def raw_io(self, io: "GraphIO") -> tuple[tuple[str, str], ...]:
        """(raw stream, graph output name): the layers stacked on dim 0."""
        return tuple((f, self.raw_name.format(stream=f)) for f in io.raw_fields)

    def shape(self, io: "GraphIO", field: str, length: int) -> tuple[int, ...]:
        """Caches `[1, H, length, dh]` grow; slots `[1, H, 1, dh]` do not."""
        return (1, io.heads(field), length if field in CACHE_FIELDS else 1, io.head_dim)

    def extra_elements(self, io: "GraphIO") -> int:
        """Floats of state beside the KV cache (the slots), constant in length."""
        return sum(int(np.prod(io.shape(k.split(".")[1], 1))) for k in io.slot_keys)

    def patterns(self, io: "GraphIO") -> tuple[list[tuple], list[tuple]]:
        dh = io.head_dim
        state = [(1, io.heads(f), None if f in CACHE_FIELDS else 1, dh)
                 for _, name in io.state_io for f in [name.rsplit(".", 1)[1]]]
        outputs = ([(1, None, io.vocab_size)]
                   + [(1, io.num_kv_heads, None, dh)] * len(io.cache_io)
                   + [(io.num_layers, io.heads(f), None, dh) for f in io.raw_fields])
        return [(1, None)] + state, outputs

    def manifest_block(self, io: "GraphIO") -> dict:
        return {"inputs": list(io.input_names), "outputs": list(io.output_names),
                "state_fields": list(io.state_fields), "raw_fields": list(io.raw_fields)}

    def slots_from(self, io: "GraphIO", raw: State, row: int) -> State:
        """That row of each layer's part of the stacked raw streams, `[1, H, 1, d]`."""
        return {key: np.ascontiguousarray(raw[stream][layer:layer + 1, :, row, None])
                for key, stream, layer in io.slot_io}


@register_form
class ExplicitStateForm(GraphForm):
    name = "explicit-state"
    targets = ("xnnpack", "portable", "onnx")
    schemes = ("int8", "int8-dynamic", "int8-block", "int4")
    exporter = "psa_edge.export.forms:ExplicitStateExport"
    sessions = {"onnxruntime": ("psa_edge.runtime.session:Session",
                                "psa_edge.backends.onnxruntime:OnnxGraph"),
                "executorch": ("psa_edge.runtime.session:Session",
                               "psa_edge.backends.executorch:PteGraph")}
    suffix = ""  # the default form adds nothing to a folder's name

    def onnx_clients(self, io):
        """The gamma = 0 twin's I/O is plain Llama's; the slots are inputs no client feeds."""
        return () if io.slot_fields else ("optimum", "onnxruntime-genai")


@register_form
class RunnerForm(GraphForm):
    name = "runner"
    targets = ("xnnpack", "portable")
    schemes = ("int8", "int8-dynamic", "int4")
    exporter = "psa_edge.export.forms:RunnerExport"
    sessions = {"executorch": ("psa_edge.runtime.session:RunnerSession",
                               "psa_edge.backends.executorch:RunnerProgram")}
    static_cache = True
    llm_runner = True

    def input_names(self, io):
        return ("tokens", "input_pos")

    def output_names(self, io):
        return ("logits",)

    def extra_elements(self, io):
        return sum(int(np.prod(s)) for n, s in io.buffers.items() if n.startswith("raw"))

    def patterns(self, io):
        return [(1, None), (1,)], [(1, None, io.vocab_size)]

    def manifest_block(self, io):
        return {"inputs": list(io.input_names), "outputs": list(io.output_names),
                "buffers": {k: list(v) for k, v in io.buffers.items()}, "window": io.window}


@register_form
class FusedForm(GraphForm):
    name = "fused"
    targets = ("onnx",)
    schemes = ("int8-dynamic", "int8-block", "int4")
    exporter = "psa_edge.export.forms:FusedExport"
    sessions = {"onnxruntime": ("psa_edge.runtime.session:FusedSession",
                                "psa_edge.backends.onnxruntime:FusedProgram")}
    static_cache = True

    def input_names(self, io):
        return (("input_ids", "input_pos", "logits_to_keep")
                + tuple(name for _, name in io.state_io))

    def raw_io(self, io):
        """One stream per layer ("{layer}.{stream}"), named as the caches are."""
        return tuple((f"{i}.{f}", self.present_name.format(layer=i, field=f))
                     for i in range(io.num_layers) for f in io.raw_fields)

    def shape(self, io, field, length):
        """Static caches; slots and raw streams `[1, S, heads dh]`, its attention's layout."""
        if field in CACHE_FIELDS:
            return (1, io.num_kv_heads, io.max_seq_len, io.head_dim)
        return (1, length if field.startswith("raw") else 1, io.heads(field) * io.head_dim)

    def patterns(self, io):
        unnamed = lambda shape: tuple(d if isinstance(d, int) else None  # noqa: E731
                                      for d in shape)
        return ([unnamed(s) for _, _, s in io.typed_inputs()],
                [unnamed(s) for _, s in io.typed_outputs()])

    def manifest_block(self, io):
        return {**super().manifest_block(io), "static_cache": list(io.shape("key", 0))}

    def slots_from(self, io, raw, row):
        """That row of the layer's own stream, `[1, 1, H d]`."""
        return {key: np.ascontiguousarray(raw[f"{layer}.{stream}"][:, row, None])
                for key, stream, layer in io.slot_io}


@register_form
class RawKeyForm(GraphForm):
    """Plain Llama's I/O, `(input_ids [1, S], attention_mask [1, P + S], position_ids [1, S],
    *past) -> (logits [1, S, V], *present)`: the caches hold the raw post-RoPE keys, which the
    graph shears itself over every cached position and the new ones, so nothing lives beside
    the KV cache and a rollback is a truncation. A client feeds it as it feeds a Llama graph.
    A query shear needs the previous query, which this I/O has no place for: refused."""

    name = "raw-key"
    targets = ("onnx",)
    schemes = ("int8", "int8-dynamic", "int8-block", "int4")
    exporter = "psa_edge.export.forms:RawKeyExport"
    sessions = {"onnxruntime": ("psa_edge.runtime.session:Session",
                                "psa_edge.backends.onnxruntime:OnnxGraph")}
    slots = False
    MASKS = ("attention_mask", "position_ids")

    def check(self, config):
        if float(config["gamma_q"]) != 0:
            raise ConfigError(f"the {self.name} form caches keys only; a query shear (gamma_q "
                              f"{config['gamma_q']:g}) needs the explicit-state form")

    def onnx_clients(self, io):
        return ("optimum", "onnxruntime-genai")

    def genai_inputs(self, io):
        return {**super().genai_inputs(io), **{name: name for name in self.MASKS}}

    def feeds(self, io, seq_len, past_len):
        """All positions attended (batch 1, no padding); positions from P on."""
        return {"attention_mask": np.ones((1, past_len + seq_len), np.int64),
                "position_ids": np.arange(past_len, past_len + seq_len, dtype=np.int64)[None]}

    def input_names(self, io):
        return ("input_ids",) + self.MASKS + tuple(name for _, name in io.state_io)

    def patterns(self, io):
        inputs, outputs = super().patterns(io)
        return inputs[:1] + [(1, None)] * len(self.MASKS) + inputs[1:], outputs

    def manifest_block(self, io):
        return {**super().manifest_block(io), "cached_keys": "raw post-RoPE"}


DEFAULT_FORM = ExplicitStateForm.name


# The artifact manifest's fields a reader relies on, and their types (docs/reference/spec.md §8).
MANIFEST_FIELDS = {"kind": str, "target": str, "form": str, "backend": str, "config": dict,
                   "max_seq_len": int, "io": dict, "files": dict, "twin": bool,
                   "variant": str, "size_bytes": int}
OPTIONAL_FIELDS = {"quantization": dict, "source_checkpoint": dict, "delegation": dict,
                   "parity": dict}


def check_manifest(manifest, where: str) -> None:
    """An artifact manifest's schema: required fields and types, a target and form psa-edge
    knows, and a file list of names and sha256s that holds the model file."""
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{where} is a JSON {type(manifest).__name__}, not an object")
    for field, kind in MANIFEST_FIELDS.items():
        value = manifest.get(field)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ArtifactError(f"{where}: field {field!r} must be a {kind.__name__}, got "
                                f"{value!r:.60}")
    for field, kind in OPTIONAL_FIELDS.items():
        if manifest.get(field) is not None and not isinstance(manifest[field], kind):
            raise ArtifactError(f"{where}: field {field!r} must be a {kind.__name__} or null")
    for field in ("gamma_k", "gamma_q"):
        value = manifest.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ArtifactError(f"{where}: field {field!r} must be a number, got {value!r:.60}")
    if manifest["kind"] != "artifact" or manifest["target"] not in BACKENDS \
            or manifest["backend"] != BACKENDS[manifest["target"]] \
            or manifest["form"] not in FORMS or manifest["target"] \
            not in FORMS[manifest["form"]].targets:
        raise ArtifactError(f"{where} describes no artifact psa-edge knows (kind "
                            f"{manifest['kind']!r:.30}, target {manifest['target']!r:.30}, "
                            f"form {manifest['form']!r:.30})")
    files = manifest["files"]
    if MODEL_FILES[manifest["target"]] not in files or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) == 64 and "/" not in k
            for k, v in files.items()):
        raise ArtifactError(f"{where}: field 'files' must map the folder's file names, the "
                            f"model's among them, to sha256 digests")


def slots_from(raw: State, io: GraphIO, row: int = -1) -> State:
    """The slots after position `row` of a chunk (default its last, the next slots): that row
    of each layer's part of the stacked raw streams, `[1, H, 1, d]` (fused form: that row of
    the layer's own stream, `[1, 1, H d]`)."""
    return io.spec.slots_from(io, raw, row)
