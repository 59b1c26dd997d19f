"""The ONNX Runtime backend: `.onnx` graphs on the CPU provider (numpy, no torch).

Contract: both classes build the session from the artifact's checked bytes
(`io.read_artifact`: what runs is what was hashed), the graph's external weights mapped from
the folder after their hash was checked; `threads` sizes the intra-op pool; with
`takes_turns` (a session that alternates with another in this process, as `bench --vs`'s two
do) the pool's workers stop spinning when a call returns. A file that ONNX Runtime cannot
load, or whose I/O is not the one its manifest's config implies, is an `ArtifactError` naming
its reason.
- `OnnxGraph(artifact, threads)`: a `base.Graph` over an explicit-state graph.
- Either records ONNX Runtime's profile to `profile_prefix*.json` when given one.
- `FusedProgram(artifact, threads)`: a fused-form graph (docs/reference/spec.md §4) bound
  once to its static caches, numpy arrays it owns (`caches`), each bound as both the past input
  and the present output, so GroupQueryAttention writes a chunk's rows in place and no call
  copies a cache. `run(tokens, position, last_only)` returns the chunk's logits `[S, V]` (with
  `last_only`, `[1, V]`: the graph computes the last row's alone) and raw streams
  (`"{layer}.{stream}"` -> `[1, S, heads dh]`) and copies the last raw rows into the slots the
  next call reads; `set_slots` replaces them (rollback, restore). A one-token call reads and
  writes arrays bound once, so a decode step allocates nothing but its returned copies.
"""

from __future__ import annotations

import numpy as np

from psa_edge.backends.base import Graph
from psa_edge.backends.huge_pages import collapse_resident_memory, resident_now
from psa_edge.contract import GraphIO, State
from psa_edge.errors import ArtifactError
from psa_edge.io import Artifact


def inference_session(artifact: Artifact, threads: int | None, io: GraphIO,
                      profile_prefix: str | None = None, takes_turns: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    if takes_turns:
        # Each session has its own pool, whose idle workers spin on after a call for the next
        # one; two sessions taking turns then each spin on the core the other needs (psa-30m's
        # fused form at 2 threads decoded at under half its speed alone:
        # docs/reference/runtime.md). ONNX Runtime's global pool would be shared, but then every
        # session of the process must use it, at one thread count.
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if profile_prefix:  # ONNX Runtime's profiler (`psa-edge bench --profile`)
        options.enable_profiling, options.profile_file_prefix = True, profile_prefix
    if artifact.weights_path is not None:
        # The graph is the checked bytes; its weights are mapped from the checked file beside
        # it, not parsed into a copy (SmolLM2-135M fp32: 0.60 GB resident, 1.26 GB from one
        # file's bytes). Prepacking stays on: disabled, the weights stay mapped instead of
        # copied, but this model decoded 15% slower.
        options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                         str(artifact.folder))
    held = resident_now()
    try:
        session = ort.InferenceSession(artifact.data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT raises its own classes for bad files
        raise ArtifactError(f"ONNX Runtime cannot load {artifact.model_path}: {str(exc)[:160]}")
    inputs, outputs = session.get_inputs(), session.get_outputs()
    where = str(artifact.model_path)
    if [i.name for i in inputs] != list(io.input_names) or \
            [o.name for o in outputs] != list(io.output_names):
        raise ArtifactError(f"{where}: the graph's input and output names are not those its "
                            f"manifest's config implies")
    io.check_signature([i.shape for i in inputs], [o.shape for o in outputs], where)
    collapse_resident_memory(held)  # the session holds its (prepacked) weights from here
    return session


class OnnxGraph(Graph):
    backend = "onnxruntime"

    def __init__(self, artifact: Artifact, threads: int | None = None,
                 profile_prefix: str | None = None, takes_turns: bool = False):
        super().__init__(GraphIO.from_manifest(artifact.manifest), artifact.manifest,
                         artifact.identity)
        self.session = inference_session(artifact, threads, self.io, profile_prefix,
                                         takes_turns)
        self.outputs = list(self.io.output_names)

    def run(self, feeds):
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))


class FusedProgram:
    backend = "onnxruntime"

    def __init__(self, artifact: Artifact, threads: int | None = None,
                 profile_prefix: str | None = None, takes_turns: bool = False):
        self.io = io = GraphIO.from_manifest(artifact.manifest)
        self.manifest, self.identity = artifact.manifest, artifact.identity
        self.session = inference_session(artifact, threads, io, profile_prefix, takes_turns)
        self.binding = self.session.io_binding()
        self.caches = {key: np.zeros(io.shape(key.split(".")[1], 0), np.float32)
                       for key, _, _ in io.cache_io}
        for key, name_in, name_out in io.cache_io:
            self.bind(name_in, self.caches[key])
            self.bind(name_out, self.caches[key], output=True)
        # The slots are arrays bound once; each call copies its last raw rows into them.
        self.slots = {f"past_key_values.{key}": np.zeros(io.shape(key.split(".")[1], 1),
                                                         np.float32) for key in io.slot_keys}
        for name, value in self.slots.items():
            self.bind(name, value)
        self.next_slot = [(f"past_key_values.{key}", stream)
                          for (key, _, _), (stream, _) in zip(io.slot_io, io.raw_io)]
        # A one-token call's inputs and outputs: arrays bound once, rebound after a chunk call.
        self.step = {"input_ids": np.zeros((1, 1), np.int64),
                     "input_pos": np.zeros(1, np.int64),
                     "logits_to_keep": np.zeros(1, np.int64),
                     "logits": np.zeros((1, 1, io.vocab_size), np.float32)}
        self.step.update((name, np.zeros(io.shape(stream.split(".")[1], 1), np.float32))
                         for stream, name in io.raw_io)
        self.step_bound = False

    def bind(self, name: str, array: np.ndarray, output: bool = False) -> None:
        """Bind a numpy array by reference (ONNX Runtime reads or writes its memory)."""
        import onnxruntime as ort

        value = ort.OrtValue.ortvalue_from_numpy(array)
        if output:
            self.binding.bind_ortvalue_output(name, value)
        else:
            self.binding.bind_ortvalue_input(name, value)

    def set_slots(self, slots: State) -> None:
        for key, value in slots.items():
            np.copyto(self.slots[f"past_key_values.{key}"], value)

    def run(self, tokens: np.ndarray, position: int, last_only: bool = False
            ) -> tuple[np.ndarray, State]:
        io, binding = self.io, self.binding
        if tokens.size == 1:
            if not self.step_bound:
                for name, array in self.step.items():
                    self.bind(name, array, output=name not in io.input_names)
                self.step_bound = True
            self.step["input_ids"][0, 0], self.step["input_pos"][0] = tokens[0], position
            self.session.run_with_iobinding(binding)
            logits = self.step["logits"][0].copy()
            raw = {stream: self.step[name].copy() for stream, name in io.raw_io}
        else:
            self.step_bound = False  # shapes depend on S: inputs by copy, outputs allocated
            binding.bind_cpu_input("input_ids", tokens.reshape(1, -1))
            binding.bind_cpu_input("input_pos", np.array([position], np.int64))
            binding.bind_cpu_input("logits_to_keep", np.array([int(last_only)], np.int64))
            for name in ["logits"] + [name for _, name in io.raw_io]:
                binding.bind_output(name)
            self.session.run_with_iobinding(binding)
            outputs = binding.get_outputs()[len(self.caches):]
            logits = outputs[0].numpy()[0]
            raw = {stream: value.numpy() for (stream, _), value in zip(io.raw_io, outputs[1:])}
        for slot, stream in self.next_slot:
            np.copyto(self.slots[slot], raw[stream][:, -1:])
        return logits, raw
