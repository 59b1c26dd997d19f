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
