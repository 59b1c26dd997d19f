"""The backends that run an exported graph, grouped by role, behind `base.Graph`'s numpy interface:
`onnxruntime` (`.onnx`, numpy + ONNX Runtime, no torch), `executorch` (`.pte` through ExecuTorch's
Python runtime, whose pybindings take torch tensors) and `eager` (the PyTorch float reference of
a checkpoint). Nothing here imports another backend; the runtime opens the first two, the checks
the third.
"""
