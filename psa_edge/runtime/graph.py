"""Exported explicit-state graphs behind one numpy interface (never imports torch itself).

Contract: `open_graph(artifact, threads)` reads the artifact's manifest and returns a `Graph`
(`threads` sizes ONNX Runtime's intra-op pool, or ExecuTorch's process-wide threadpool).
`graph.step(tokens, state)` runs one chunk `tokens [S]` on `state` (a dict "layer.field" ->
array, SPEC §3) and returns the chunk's logits `[S, V]` (an array the caller owns), the new
state and the chunk's raw post-RoPE keys/queries as the graph returns them, one array per
stream with the layers stacked on dim 0 ("raw_key" -> `[layers, Hkv, S, dh]`), which a session
needs to roll the previous-key slot back to any position of the chunk. The new slots are views
of the last rows (there is no separate slot output). It never changes its inputs.
Backends:
- `onnx`: ONNX Runtime (`.onnx`). With `io_binding=True` the new caches are written in place
  into two buffers per state tensor preallocated to the artifact's max length (the graph's own
  concatenation writes there; inputs are bound without copies), used in turn. It is off by
  default: on ORT's CPU provider it measured slower than plain `run` (docs/runtime.md,
  tools/runtime_bench.py);
- `executorch`: ExecuTorch's Python runtime (`.pte`, xnnpack or portable), in
  `psa_edge.executorch_backend`, imported only when such an artifact is opened (its pybindings
  take and return torch tensors, so that module is the one place torch meets the runtime);
- `eager`: the PyTorch float reference (`psa_edge.export.eager`), for a `model.pt`.
The manifest must match the artifact (sha256) or `ArtifactError` is raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from psa_edge.errors import ArtifactError
from psa_edge.io import manifest_path, sha256_file

State = dict[str, np.ndarray]
CACHE_FIELDS = ("key", "value")
# Each slot and the graph output it is read from: the last row of the chunk's raw stream.
RAW_OF_SLOT = {"prev_key": "raw_key", "prev_query": "raw_query"}


@dataclass(frozen=True)
class GraphSpec:
    """What a runtime needs to know of an explicit-state graph, read from its manifest."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_seq_len: int
    state_fields: tuple[str, ...]
    raw_fields: tuple[str, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    @classmethod
    def from_manifest(cls, manifest: dict) -> "GraphSpec":
        cfg, io = manifest["config"], manifest["io"]
        spec = cls(num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
                   num_kv_heads=cfg["num_key_value_heads"],
                   head_dim=cfg["hidden_size"] // cfg["num_attention_heads"],
                   vocab_size=cfg["vocab_size"], max_seq_len=manifest["max_seq_len"],
                   state_fields=tuple(io["state_fields"]), raw_fields=tuple(io["raw_fields"]),
                   input_names=tuple(io["inputs"]), output_names=tuple(io["outputs"]))
        missing = [name for _, name in spec.raw_io if name not in spec.output_names]
        if missing:
            raise ArtifactError(f"the graph has no output {missing[0]!r} (per-layer raw outputs "
                                f"of an older psa-edge); export the artifact again")
        return spec

    @cached_property
    def state_io(self) -> tuple[tuple[str, str], ...]:
        """(state key, graph input name) per layer and state field, in input order."""
        return tuple((f"{i}.{f}", f"past_key_values.{i}.{f}")
                     for i in range(self.num_layers) for f in self.state_fields)

    @cached_property
    def cache_io(self) -> tuple[tuple[str, str, str], ...]:
        """(state key, graph input name, graph output name) of the KV caches."""
        return tuple((f"{i}.{f}", f"past_key_values.{i}.{f}", f"present.{i}.{f}")
                     for i in range(self.num_layers) for f in self.state_fields
                     if f in CACHE_FIELDS)

    @cached_property
    def slot_io(self) -> tuple[tuple[str, str, int], ...]:
        """(slot state key, raw stream, layer): the slot's next value is the last row of that
        layer's part of the stream."""
        return tuple((f"{i}.{f}", RAW_OF_SLOT[f], i) for i in range(self.num_layers)
                     for f in self.state_fields if f in RAW_OF_SLOT)

    @cached_property
    def slot_keys(self) -> tuple[str, ...]:
        """State keys of the previous-key (and previous-query) slots."""
        return tuple(key for key, _, _ in self.slot_io)

    @cached_property
    def raw_io(self) -> tuple[tuple[str, str], ...]:
        """(raw stream, graph output name): one output per sheared stream, the layers stacked
        on dim 0."""
        return tuple((f, f"present.{f}") for f in self.raw_fields)

    def shape(self, field: str, length: int) -> tuple[int, int, int, int]:
        """Shape of a state tensor after `length` positions (caches grow, slots do not)."""
        heads = self.num_heads if field in ("prev_query", "raw_query") else self.num_kv_heads
        return (1, heads, length if field in ("key", "value") else 1, self.head_dim)

    def empty_state(self) -> State:
        """The P = 0 state: empty caches, zero slots (the causal zero initial state)."""
        return {key: np.zeros(self.shape(key.split(".")[1], 0), np.float32)
                for key, _ in self.state_io}


def same_architecture(a: dict, b: dict) -> bool:
    """Whether two model configs differ at most in the shear (gamma_q, gamma_k, variant)."""
    strip = lambda cfg: {k: v for k, v in cfg.items()  # noqa: E731
                         if k not in ("gamma_q", "gamma_k", "variant")}
    return strip(a) == strip(b)


def read_manifest(artifact: str | Path, check_hash: bool = True) -> dict:
    artifact = Path(artifact)
    if not artifact.is_file():
        raise ArtifactError(f"artifact {artifact} does not exist")
    mpath = manifest_path(artifact)
    if not mpath.is_file():
        raise ArtifactError(f"artifact {artifact} has no manifest {mpath.name} beside it")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"manifest {mpath} is not valid JSON ({exc})")
    if check_hash and manifest.get("artifact_sha256") != sha256_file(artifact):
        raise ArtifactError(f"manifest {mpath.name} does not match {artifact.name} "
                            f"(sha256 differs)")
    return manifest


def slots_from(raw: State, spec: GraphSpec, row: int = -1) -> State:
    """The slots after position `row` of a chunk (default its last, the next slots): that row
    of each layer's part of the stacked raw streams, `[1, H, 1, d]` (a view when S = 1)."""
    return {key: np.ascontiguousarray(raw[stream][layer:layer + 1, :, row, None])
            for key, stream, layer in spec.slot_io}


class Graph:
    backend = ""

    def __init__(self, artifact: Path, manifest: dict):
        self.artifact, self.manifest = artifact, manifest
        self.spec = GraphSpec.from_manifest(manifest)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def step(self, tokens: np.ndarray, state: State) -> tuple[np.ndarray, State, State]:
        spec = self.spec
        feeds = {"input_ids": tokens.reshape(1, -1)}
        feeds.update((name_in, state[key]) for key, name_in in spec.state_io)
        out = self.run(feeds)
        new_state = {key: out[name_out] for key, _, name_out in spec.cache_io}
        raw = {stream: out[name_out] for stream, name_out in spec.raw_io}
        new_state.update(slots_from(raw, spec))
        return out["logits"][0], new_state, raw


class OnnxGraph(Graph):
    backend = "onnx"

    def __init__(self, artifact: Path, manifest: dict, threads: int | None = None,
                 io_binding: bool = False):
        super().__init__(artifact, manifest)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(artifact), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own classes for bad files
            raise ArtifactError(f"ONNX Runtime cannot load {artifact}: {str(exc)[:160]}")
        self.io_binding = io_binding
        # With IO binding: two max-length buffers per state output, used in turn (a call's
        # inputs may be views into one of them, so its outputs go to the other).
        spec = self.spec
        self.buffers = [{key: np.empty(int(np.prod(spec.shape(key.split(".")[1],
                                                               spec.max_seq_len))), np.float32)
                         for key, _, _ in spec.cache_io} for _ in range(2 if io_binding else 0)]

    def run(self, feeds):
        outputs = self.session.run(list(self.spec.output_names), feeds)
        return dict(zip(self.spec.output_names, outputs))

    def step(self, tokens, state):
        if not self.io_binding:
            return super().step(tokens, state)
        spec = self.spec
        length = state["0.key"].shape[2] + tokens.size
        in_use = [any(np.may_share_memory(state[k], b[k]) for k in b) for b in self.buffers]
        if all(in_use):  # cannot happen through Session; copy rather than overwrite an input
            state, in_use = {k: v.copy() for k, v in state.items()}, [False, False]
        target = self.buffers[1] if in_use[0] else self.buffers[0]
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(tokens.reshape(1, -1)))
        new_state = {}
        for key, name_in in spec.state_io:
            binding.bind_cpu_input(name_in, np.ascontiguousarray(state[key]))
        for key, _, name_out in spec.cache_io:
            shape = spec.shape(key.split(".")[1], length)
            view = target[key][:int(np.prod(shape))].reshape(shape)
            binding.bind_output(name_out, "cpu", 0, np.float32, shape, view.ctypes.data)
            new_state[key] = view
        allocated = ["logits"] + [name_out for _, name_out in spec.raw_io]
        for name in allocated:  # ORT allocates these; outputs come back in binding order
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()[len(spec.cache_io):]
        outputs = {name: value.numpy() for name, value in zip(allocated, values)}
        raw = {stream: outputs[name_out] for stream, name_out in spec.raw_io}
        new_state.update(slots_from(raw, spec))
        return outputs["logits"][0], new_state, raw


def open_graph(artifact: str | Path, threads: int | None = None) -> Graph:
    artifact = Path(artifact)
    manifest = read_manifest(artifact)
    if manifest.get("kind") == "checkpoint":
        from psa_edge.export.eager import EagerGraph

        return EagerGraph(artifact, manifest)
    if manifest.get("form") != "explicit-state":
        raise ArtifactError(f"{artifact.name} is a {manifest.get('form')!r} artifact; this "
                            f"runtime drives explicit-state graphs")
    if manifest.get("target") == "onnx":
        return OnnxGraph(artifact, manifest, threads)
    if manifest.get("target") in ("xnnpack", "portable"):
        from psa_edge.executorch_backend import PteGraph, set_threads

        if threads:  # ExecuTorch's threadpool is process-wide
            set_threads(threads)
        return PteGraph(artifact, manifest)
    raise ArtifactError(f"{artifact.name}: unknown target {manifest.get('target')!r}")
