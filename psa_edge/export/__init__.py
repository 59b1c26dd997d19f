"""Export of a checkpoint to ONNX and ExecuTorch (imports torch).

The stage order lives in `pipeline.run_export` (load -> transform -> export -> quantize -> lower
-> save); `forms` holds the graph forms, `onnx_target` and `executorch_target` the targets,
each an object providing its stages; `quantize` the int8 flows; `inspect` reads an artifact
back. `quiet()` keeps the exporters' own prints and warnings off the CLI's output.
"""

import contextlib
import io
import logging
import warnings


def quiet_loggers() -> None:
    """torchao (imported by executorch) warns through `logging` about CUDA kernels a CPU build
    lacks and about a deprecated pytree registration. torch configures its loggers on import,
    so the levels are set after it."""
    import torch  # noqa: F401

    for name in ("torch", "torchao"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def quiet():
    quiet_loggers()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield
