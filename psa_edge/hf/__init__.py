"""Hugging Face layouts: importing a transformers Llama folder, exporting the `save_pretrained`
layout with PSA's remote code, and the config files ONNX clients (optimum, onnxruntime-genai)
read. `modeling_psa.py` is the remote code itself, standalone: it is copied, never imported here.
"""
