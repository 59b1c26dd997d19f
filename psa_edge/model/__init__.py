"""The PyTorch definition of the PSA transformer (imports torch)."""

from psa_edge.model.config import PRESETS, VARIANTS, ModelConfig, preset_config
from psa_edge.model.transformer import PSATransformer, count_parameters

__all__ = ["PRESETS", "VARIANTS", "ModelConfig", "PSATransformer", "count_parameters",
           "preset_config"]
