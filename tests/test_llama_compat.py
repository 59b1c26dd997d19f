"""A gamma = 0 checkpoint IS a Llama checkpoint: Hugging Face's LlamaForCausalLM loads our
state_dict strictly from `to_llama_dict()` and gives the same logits (docs/spec.md §1)."""

import warnings

import torch

from conftest import make_model


def test_twin_loads_into_transformers_llama():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformers import LlamaConfig, LlamaForCausalLM

    psa = make_model("key-only", num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=2)
    hf = LlamaForCausalLM(LlamaConfig(**psa.cfg.to_llama_dict())).eval()
    hf.load_state_dict(psa.state_dict(), strict=True)
    twin = make_model("baseline", num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2)
    twin.load_state_dict(psa.state_dict())
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(tokens).logits
        assert (twin(tokens) - reference).abs().max() < 1e-4 * reference.abs().max()
        # ... and the shear is what makes the PSA model differ from that Llama.
        assert (psa(tokens) - reference).abs().max() > 1e-2 * reference.abs().max()
