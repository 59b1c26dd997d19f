"""The PyTorch definition of the PSA transformer.

`config` (the dataclass and the named presets) does not import torch, so the CLI can check a
preset or a variant name before it pays for torch; the transformer's names are imported from
`transformer` on first use (PEP 562), and that import brings torch.
"""

from psa_edge.model.config import PRESETS, VARIANTS, ModelConfig, preset_config

__all__ = ["PRESETS", "VARIANTS", "ModelConfig", "PSATransformer", "count_parameters",
           "preset_config"]


def __getattr__(name: str):
    if name in ("PSATransformer", "count_parameters"):
        from psa_edge.model import transformer

        return getattr(transformer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
