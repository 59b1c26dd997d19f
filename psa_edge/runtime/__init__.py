"""The device runtime: numpy + onnxruntime only (ExecuTorch's runtime when a .pte is opened).

Nothing on this path imports torch; a test runs it with torch made unimportable.
"""
