"""Exported explicit-state graphs behind one numpy interface (never imports torch itself).

Contract: `open_graph(artifact)` reads the artifact's manifest and returns a `Graph` whose
`run(feeds)` maps input names (SPEC §2, `psa_edge.export.graphs`) to numpy arrays and returns a
dict of output name -> numpy array. Backends:
- `onnx`: ONNX Runtime (`.onnx`);
- `executorch`: ExecuTorch's Python runtime (`.pte`, xnnpack or portable), imported only here
  and only when such an artifact is opened (the ExecuTorch pybindings bring torch with them).
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
        return cls(num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
                   num_kv_heads=cfg["num_key_value_heads"],
                   head_dim=cfg["hidden_size"] // cfg["num_attention_heads"],
                   vocab_size=cfg["vocab_size"], max_seq_len=manifest["max_seq_len"],
                   state_fields=tuple(io["state_fields"]), raw_fields=tuple(io["raw_fields"]),
                   input_names=tuple(io["inputs"]), output_names=tuple(io["outputs"]))

    @cached_property
    def state_io(self) -> tuple[tuple[str, str, str], ...]:
        """(state key, graph input name, graph output name) per layer and state field."""
        return tuple((f"{i}.{f}", f"past_key_values.{i}.{f}", f"present.{i}.{f}")
                     for i in range(self.num_layers) for f in self.state_fields)

    @cached_property
    def raw_io(self) -> tuple[tuple[str, str], ...]:
        return tuple((f"{i}.{f}", f"present.{i}.{f}")
                     for i in range(self.num_layers) for f in self.raw_fields)

    def empty_state(self) -> dict[str, np.ndarray]:
        """The P = 0 state: empty caches, zero slots (the causal zero initial state)."""
        state = {}
        for i in range(self.num_layers):
            for f in self.state_fields:
                heads = self.num_heads if f == "prev_query" else self.num_kv_heads
                length = 0 if f in ("key", "value") else 1
                state[f"{i}.{f}"] = np.zeros((1, heads, length, self.head_dim), np.float32)
        return state


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


class Graph:
    backend = ""

    def __init__(self, artifact: Path, manifest: dict):
        self.artifact, self.manifest = artifact, manifest
        self.spec = GraphSpec.from_manifest(manifest)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError


class OnnxGraph(Graph):
    backend = "onnx"

    def __init__(self, artifact: Path, manifest: dict, threads: int | None = None):
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

    def run(self, feeds):
        outputs = self.session.run(list(self.spec.output_names), feeds)
        return dict(zip(self.spec.output_names, outputs))


class PteGraph(Graph):
    backend = "executorch"

    def __init__(self, artifact: Path, manifest: dict):
        super().__init__(artifact, manifest)
        from executorch.runtime import Runtime

        try:
            program = Runtime.get().load_program(str(artifact))
            self.method = program.load_method("forward")
        except Exception as exc:  # noqa: BLE001
            raise ArtifactError(f"ExecuTorch cannot load {artifact}: {str(exc)[:160]}")

    def run(self, feeds):
        import torch  # ExecuTorch's pybindings take and return torch tensors

        args = [as_torch(torch, feeds[n]) for n in self.spec.input_names]
        outputs = self.method.execute(args)
        return {n: o.numpy() for n, o in zip(self.spec.output_names, outputs)}


def as_torch(torch, array: np.ndarray):
    """A tensor with standard contiguous strides; ExecuTorch asserts on the zero strides that
    numpy gives an empty (P = 0) cache."""
    if array.size == 0:
        return torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype)
    return torch.from_numpy(np.ascontiguousarray(array))


def open_graph(artifact: str | Path, threads: int | None = None) -> Graph:
    artifact = Path(artifact)
    manifest = read_manifest(artifact)
    if manifest.get("form") != "explicit-state":
        raise ArtifactError(f"{artifact.name} is a {manifest.get('form')!r} artifact; this "
                            f"runtime drives explicit-state graphs")
    if manifest.get("target") == "onnx":
        return OnnxGraph(artifact, manifest, threads)
    if manifest.get("target") in ("xnnpack", "portable"):
        return PteGraph(artifact, manifest)
    raise ArtifactError(f"{artifact.name}: unknown target {manifest.get('target')!r}")
