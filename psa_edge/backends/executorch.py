"""The ExecuTorch backend: `.pte` programs through ExecuTorch's Python runtime.

Contract:
- `PteGraph(artifact)` is a `base.Graph` over an explicit-state program (a one-token step runs
  method `decode` when the program has it);
- `RunnerProgram(artifact)` drives a runner-form program: `run(tokens, position)` is one call of
  `forward(tokens, input_pos)` and returns logits `[S, V]`; the caches live in the program;
- `set_threads(n)` sizes ExecuTorch's process-wide threadpool.
Programs load from the artifact's checked bytes. ExecuTorch's pybindings take and return torch
tensors (they refuse numpy arrays), so this module imports torch; the runtime imports it only
when a `.pte` is opened. ExecuTorch logs natively while it loads (cpuinfo probes, the reason of
a failure) and its Python imports warn about optional kernels: both are kept off the terminal,
and a program that cannot load is an `ArtifactError` naming the native reason.
"""

from __future__ import annotations

import logging
import os
import re

# ExecuTorch's llama kernels (the runner form's attention), as its wheel builds them, multiply
# matrices in torch's MKL, whose OpenMP threads would spin beside XNNPACK's own pool: on 2
# cores, psa-30m int4's 128-token prefill at 2 threads ran at 0.6x. Read by MKL when torch is
# first imported, so set before it (a process that imported torch already keeps its own).
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from psa_edge.backends.base import Graph
from psa_edge.backends.huge_pages import collapse_resident_memory, resident_now
from psa_edge.contract import GraphIO
from psa_edge.errors import ArtifactError
from psa_edge.io import Artifact, native_output_captured

NATIVE_LOG_PREFIX = re.compile(r"^\[[^]]*\] *")  # "[program.cpp:114] " before the message


def quiet_imports() -> None:
    """executorch imports torchao, which warns through `logging` about CUDA kernels a CPU
    build lacks and about a deprecated pytree registration: not the user's concern. torch
    configures its loggers on import, so the levels are set after it."""
    for name in ("torch", "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)


def load_llama_ops() -> None:
    """Register ExecuTorch's llama custom ops (`update_cache`, `custom_sdpa`, which the runner
    form's caches are written and read by): their kernels with ExecuTorch's runtime in this
    process, and with torch, with the shape functions torch.export traces them by."""
    quiet_imports()
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401


def load_methods(artifact: Artifact, optional: tuple[str, ...] = ()) -> tuple[object, dict]:
    """The program and its method `forward` and those of the `optional` names that it has. The
    methods run on the program's memory: the caller keeps the program alive with them."""
    quiet_imports()
    log: list[str] = []
    held = resident_now()
    try:
        with native_output_captured() as log:
            from executorch.extension.pybindings import portable_lib
            from executorch.runtime import Runtime

            load_llama_ops()
            # The threadpool probes the CPU (cpuinfo) natively on its first use: do it here.
            portable_lib._threadpool_get_thread_count()
            program = Runtime.get().load_program(artifact.data)
            names = [n for n in ("forward", *optional) if n in program.method_names]
            signatures = {name: signature(program.metadata(name)) for name in names}
            methods = {name: program.load_method(name) for name in names}
    except Exception as exc:  # noqa: BLE001 - the pybindings raise plain RuntimeErrors
        reason = f" ({NATIVE_LOG_PREFIX.sub('', log[-1])})" if log else ""
        raise ArtifactError(f"ExecuTorch cannot load {artifact.model_path}: "
                            f"{str(exc)[:160]}{reason}")
    if "forward" not in methods:
        raise ArtifactError(f"{artifact.model_path} has no method 'forward'")
    io = GraphIO.from_manifest(artifact.manifest)
    for name, (inputs, outputs) in signatures.items():
        io.check_signature(inputs, outputs, f"{artifact.model_path} method {name}")
    collapse_resident_memory(held)  # XNNPACK packed the weights as the methods loaded
    return program, methods


def signature(meta) -> tuple[list, list]:
    """The input and output sizes of a method (dynamic dims at their upper bound)."""
    return ([tuple(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())],
            [tuple(meta.output_tensor_meta(i).sizes()) for i in range(meta.num_outputs())])


def as_torch(array: np.ndarray) -> torch.Tensor:
    """A tensor with standard contiguous strides; ExecuTorch asserts on the zero strides that
    numpy gives an empty (P = 0) cache."""
    if array.size == 0:
        return torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype)
    return torch.from_numpy(np.ascontiguousarray(array))


class PteGraph(Graph):
    backend = "executorch"

    def __init__(self, artifact: Artifact, threads: int | None = None,
                 profile_prefix: str | None = None, takes_turns: bool = False):
        """The runtime's one program signature (`GraphForm.sessions`); ExecuTorch has no
        profiler prefix, and its threadpool is one per process already (`takes_turns`)."""
        super().__init__(GraphIO.from_manifest(artifact.manifest), artifact.manifest,
                         artifact.identity)
        if threads:  # ExecuTorch's threadpool is process-wide
            set_threads(threads)
        self.program, methods = load_methods(artifact, optional=("decode",))
        self.method = methods["forward"]
        self.decode = methods.get("decode", self.method)

    def run(self, feeds):
        args = [as_torch(feeds[n]) for n in self.io.input_names]
        method = self.decode if feeds["input_ids"].size == 1 else self.method
        outputs = method.execute(args)  # fresh tensors each call (checked: no aliasing)
        return {n: o.numpy() for n, o in zip(self.io.output_names, outputs)}


class RunnerProgram:
    """A runner-form program (`forward(tokens, input_pos) -> logits`, the form ExecuTorch's LLM
    runner drives). Position 0 starts a new sequence; any other position continues from the
    program's own cache rows before it (docs/reference/spec.md §4)."""

    backend = "executorch"

    def __init__(self, artifact: Artifact, threads: int | None = None,
                 profile_prefix: str | None = None, takes_turns: bool = False):
        if threads:  # as PteGraph's
            set_threads(threads)
        self.io = GraphIO.from_manifest(artifact.manifest)
        self.manifest, self.identity = artifact.manifest, artifact.identity
        self.program, methods = load_methods(artifact)
        self.method = methods["forward"]
        # The position and a one-token call's token: arrays written in place, which torch views
        # without a copy (building two tensors per decode step cost more than writing two
        # numbers).
        self.position, self.step_token = np.zeros(1, np.int64), np.zeros((1, 1), np.int64)
        self.position_input = torch.from_numpy(self.position)
        self.step_token_input = torch.from_numpy(self.step_token)

    def run(self, tokens: np.ndarray, position: int) -> np.ndarray:
        self.position[0] = position
        if tokens.size == 1:
            self.step_token[0, 0] = tokens[0]
            token_input = self.step_token_input
        else:
            token_input = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))[None]
        return self.method.execute([token_input, self.position_input])[0].numpy()[0]


def set_threads(threads: int | None) -> int:
    """Resize ExecuTorch's process-wide threadpool (when `threads` is given); the size in use."""
    quiet_imports()
    # The threadpool's first use probes the CPU (cpuinfo) and a reset logs the new size, natively.
    with native_output_captured():
        from executorch.extension.pybindings import portable_lib

        if threads and threads != portable_lib._threadpool_get_thread_count():
            portable_lib._unsafe_reset_threadpool(threads)
        return portable_lib._threadpool_get_thread_count()
