"""psa-edge: export toolchain for small Phase Space Attention (PSA) transformers.

The package is laid out as the pipeline it implements: `model/` (PyTorch definition),
`tasks/` (generated induction benchmarks), `train/` (training and evaluation) and `cli.py`.
Importing the package is cheap: nothing here imports torch at module level.
"""

__version__ = "0.1.0"
