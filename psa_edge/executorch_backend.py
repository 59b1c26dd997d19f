"""The ExecuTorch backend of the runtime: `.pte` programs through ExecuTorch's Python runtime.

Contract: `PteGraph` is a `runtime.graph.Graph` over an explicit-state `.pte` (one-token steps
run method `decode` when the program has it); `RunnerProgram` drives a runner-form `.pte`
(`forward(tokens, input_pos)`, cache inside the program); `set_threads(n)` sizes ExecuTorch's
process-wide threadpool. ExecuTorch's pybindings take and return torch tensors (they refuse
numpy arrays), so this module imports torch; it lives outside `psa_edge.runtime`, which stays
numpy + onnxruntime, and is imported only when a `.pte` is opened.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from psa_edge.errors import ArtifactError
from psa_edge.io import native_output_captured
from psa_edge.runtime.graph import Graph

NATIVE_LOG_PREFIX = re.compile(r"^\[[^]]*\] *")  # "[program.cpp:114] " before the message


class PteGraph(Graph):
    backend = "executorch"

    def __init__(self, artifact: Path, manifest: dict):
        super().__init__(artifact, manifest)
        methods = load_methods(artifact, optional=("decode",))
        self.method = methods["forward"]
        # A one-token step runs method `decode` (S = 1) when the program has it.
        self.decode = methods.get("decode", self.method)

    def run(self, feeds):
        args = [as_torch(feeds[n]) for n in self.spec.input_names]
        method = self.decode if feeds["input_ids"].size == 1 else self.method
        outputs = method.execute(args)  # fresh tensors each call (checked: no aliasing)
        return {n: o.numpy() for n, o in zip(self.spec.output_names, outputs)}


class RunnerProgram:
    """A runner-form `.pte` (`forward(tokens, input_pos) -> logits`, cache inside the program),
    the form ExecuTorch's LLM runner drives. `run(tokens, position)` returns logits `[S, V]`;
    position 0 starts a new sequence (the program masks its stale slot there)."""

    def __init__(self, artifact: Path):
        self.method = load_methods(artifact)["forward"]

    def run(self, tokens: np.ndarray, position: int) -> np.ndarray:
        tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))[None]
        return self.method.execute([tokens, torch.tensor([position])])[0][0].numpy()


def load_methods(artifact: Path, optional: tuple[str, ...] = ()) -> dict:
    """The program's method `forward` and those of the `optional` names that it has.
    ExecuTorch logs natively while it loads (cpuinfo probes on every x86 machine, the reason of
    a failure): the log is kept off the terminal, and its last line names the reason in the
    `ArtifactError`."""
    quiet_executorch_import()
    from executorch.runtime import Runtime

    log: list[str] = []
    try:
        with native_output_captured() as log:
            program = Runtime.get().load_program(str(artifact))
            names = [n for n in ("forward", *optional) if n in program.method_names]
            methods = {name: program.load_method(name) for name in names}
    except Exception as exc:  # noqa: BLE001 - the pybindings raise plain RuntimeErrors
        reason = f" ({NATIVE_LOG_PREFIX.sub('', log[-1])})" if log else ""
        raise ArtifactError(f"ExecuTorch cannot load {artifact}: {str(exc)[:160]}{reason}")
    if "forward" not in methods:
        raise ArtifactError(f"{artifact} has no method 'forward' (it has "
                            f"{', '.join(program.method_names)})")
    return methods


def quiet_executorch_import() -> None:
    """executorch.runtime imports torch and torchao, which log warnings about optional CUDA
    kernels and deprecations that are not the user's concern."""
    import logging

    for name in ("torch", "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)


def as_torch(array: np.ndarray) -> torch.Tensor:
    """A tensor with standard contiguous strides; ExecuTorch asserts on the zero strides that
    numpy gives an empty (P = 0) cache."""
    if array.size == 0:
        return torch.empty(array.shape, dtype=torch.from_numpy(array[:0]).dtype)
    return torch.from_numpy(np.ascontiguousarray(array))


def set_threads(threads: int | None) -> int:
    """Resize ExecuTorch's process-wide threadpool (when `threads` is given); the size in use."""
    quiet_executorch_import()
    from executorch.extension.pybindings import portable_lib

    # The threadpool's first use probes the CPU (cpuinfo) and a reset logs the new size, natively.
    with native_output_captured():
        if threads and threads != portable_lib._threadpool_get_thread_count():
            portable_lib._unsafe_reset_threadpool(threads)
        return portable_lib._threadpool_get_thread_count()
