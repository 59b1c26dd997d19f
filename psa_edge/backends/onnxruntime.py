"""The ONNX Runtime backend: an explicit-state `.onnx` on the CPU provider (numpy, no torch).

Contract: `OnnxGraph(artifact, threads)` builds the session from the artifact's checked bytes
(`io.read_artifact`: what runs is what was hashed); `threads` sizes the intra-op pool. A file
that ONNX Runtime cannot load is an `ArtifactError` naming its reason.
"""

from __future__ import annotations

from psa_edge.backends.base import Graph
from psa_edge.contract import GraphIO
from psa_edge.errors import ArtifactError
from psa_edge.io import Artifact


class OnnxGraph(Graph):
    backend = "onnxruntime"

    def __init__(self, artifact: Artifact, threads: int | None = None):
        super().__init__(GraphIO.from_manifest(artifact.manifest), artifact.manifest,
                         artifact.identity)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(artifact.data, options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own classes for bad files
            raise ArtifactError(f"ONNX Runtime cannot load {artifact.model_path}: "
                                f"{str(exc)[:160]}")
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        where = str(artifact.model_path)
        if [i.name for i in inputs] != list(self.io.input_names) or \
                [o.name for o in outputs] != list(self.io.output_names):
            raise ArtifactError(f"{where}: the graph's input and output names are not those its "
                                f"manifest's config implies")
        self.io.check_signature([i.shape for i in inputs], [o.shape for o in outputs], where)
        self.outputs = list(self.io.output_names)

    def run(self, feeds):
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))
