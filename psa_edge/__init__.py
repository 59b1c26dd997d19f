"""psa-edge: export toolchain for small Phase Space Attention (PSA) transformers.

The package is laid out as the pipeline it implements: `model/` (the PyTorch definition),
`tasks/` (generated induction benchmarks and text corpora), `train/` (training and evaluation),
`hf/` (Hugging Face folders in and out), `export/` (ONNX and ExecuTorch artifacts), `runtime/`
(incremental decoding; numpy and onnxruntime only), `backends/` (the engines it drives),
`checks/` (parity, verify, quant-check) and `cli.py`. Importing the package is cheap: nothing
here imports torch at module level.
"""

__version__ = "0.1.0"

SEED_MAX = 2**32 - 1  # numpy's and torch's common seed range
LENGTH_MAX = 1 << 20  # tokens; a bound for lengths that would otherwise exhaust memory

# The training options' bounds, name -> (low, high, kind): the command line's `train` options
# take theirs from here, and `train --resume` checks a training state's by them. They live at
# the root because the device bundle's CLI, which carries no train/, defines those options too.
# A float's low bound is exclusive where EXCLUSIVE_LOW names it.
TRAIN_RANGES = {
    "layers": (1, 1024, int), "steps": (1, 10**9, int), "seed": (0, SEED_MAX, int),
    "batch_size": (1, LENGTH_MAX, int), "warmup": (0, 10**9, int),
    "eval_every": (1, 10**9, int), "eval_samples": (1, LENGTH_MAX, int),
    "vocab_size": (2, LENGTH_MAX, int), "state_every": (0, 10**9, int),
    "gamma": (0.0, 100.0, float), "lr": (0.0, 10.0, float), "weight_decay": (0.0, 10.0, float),
    "stop_at": (0.0, 1.0, float)}
EXCLUSIVE_LOW = {"lr"}


def is_integer(value, low, high) -> bool:
    """Whether `value` is an int (a bool is not) in [low, high]: what a bound above checks."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def is_number(value, low, high) -> bool:
    """Whether `value` is an int or float (a bool is not) in [low, high]; NaN never is, and
    an infinity is outside any finite bounds."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and low <= value <= high)
