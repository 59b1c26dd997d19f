"""Export of a checkpoint to ONNX and ExecuTorch; the stage order lives in `pipeline.run_export`.

`graphs` (the exportable forms and their I/O names), `onnx_target`, `executorch_target`,
`parity` (artifact vs eager fp32 on a probe), `report` (summary and `inspect`). Imports torch.
"""
