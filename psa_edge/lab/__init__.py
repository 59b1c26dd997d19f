"""The measurement lab beside `psa-edge bench`: what a benchmark writer wants and a device
does not need, kept apart from the device runtime and left out of the device bundle.

- `bench.py`: `run_bench` / `execute` are the runtime's (`runtime.bench`) plus FLOPs per
  decoded token and, for a form ExecuTorch's LLM runner loads, that runner's own Stats beside
  psa-edge's loop;
- `profile.py`: `bench --profile`, where the time goes per ONNX Runtime operator.

It may import the base, the backends and the runtime; nothing below imports it.
"""
