"""The PSA operator and transformer against independent formulas
(docs/reference/spec.md §1, §3)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy_reference as ref
from conftest import REPO, make_model
from psa_edge.errors import ConfigError
from psa_edge.model import PSATransformer, count_parameters, preset_config
from psa_edge.model.config import PRESETS, ModelConfig, gammas_for
from psa_edge.model.ops import apply_rope, causal_bias, rope_cos_sin, rope_inv_freq, shear
from psa_edge.model.transformer import LayerCache

VARIANTS = ("baseline", "key-only", "symmetric", "query-only")


def state_dict64(model):
    return {k: v.detach().double().numpy() for k, v in model.state_dict().items()}


def test_four_term_score_identity():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 12, 16, generator=g, dtype=torch.float64), \
        torch.randn(1, 1, 12, 16, generator=g, dtype=torch.float64)
    zero = torch.zeros(1, 1, 1, 16, dtype=torch.float64)
    gq, gk = 0.3, 0.8
    pq, pk = shear(q, zero, 1.0) - q, shear(k, zero, 1.0) - k  # momenta p = x_t - x_{t-1}
    lhs = shear(q, zero, gq) @ shear(k, zero, gk).transpose(-1, -2)
    t = lambda a, b: a @ b.transpose(-1, -2)  # noqa: E731
    rhs = t(q, k) + gq * t(pq, k) + gk * t(q, pk) + gq * gk * t(pq, pk)
    assert torch.allclose(lhs, rhs, atol=1e-12)
    assert not torch.allclose(lhs, t(q, k), atol=1e-3)  # the shear changes the scores


def test_zero_initial_state():
    x = torch.randn(1, 2, 5, 8)
    out = shear(x, torch.zeros(1, 2, 1, 8), 0.8)
    assert torch.allclose(out[:, :, 0], 1.8 * x[:, :, 0])
    assert torch.allclose(out[:, :, 3], x[:, :, 3] + 0.8 * (x[:, :, 3] - x[:, :, 2]))


def test_rope_matches_pairwise_rotation():
    x = torch.randn(1, 1, 7, 16, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(7), rope_inv_freq(16, 10000.0))
    ours = apply_rope(x, cos.double(), sin.double())[0, 0].numpy()
    assert np.allclose(ours, ref.rope(x[0, 0].numpy(), 10000.0), atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_independent_post_rope_reference(gqa_models, variant):
    model = gqa_models[variant]
    tokens = np.random.default_rng(1).integers(0, model.cfg.vocab_size, 12)
    ours = model(torch.from_numpy(tokens)[None])[0].double().detach().numpy()
    expected = ref.forward(state_dict64(model), model.cfg, tokens, placement="post")
    assert np.abs(ours - expected).max() < 1e-3 * max(1.0, np.abs(expected).max())
    if variant != "baseline":  # a pre-RoPE shear is a different operator
        pre = ref.forward(state_dict64(model), model.cfg, tokens, placement="pre")
        assert np.abs(ours - pre).max() > 100 * np.abs(ours - expected).max()


def test_pre_rope_shear_gives_different_scores():
    cfg = preset_config("tiny", "symmetric")
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(10, 32)), rng.normal(size=(10, 32))
    post = ref.attention_scores(q, k, cfg, "post")
    pre = ref.attention_scores(q, k, cfg, "pre")
    assert np.abs(post - pre).max() > 0.1


def test_gamma_zero_is_plain_attention():
    model = make_model("baseline", num_attention_heads=4, num_key_value_heads=2)
    tokens = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        x = model.model.embed_tokens(tokens)
        attn = model.model.layers[0].self_attn
        xn = model.model.layers[0].input_layernorm(x)
        dh = model.cfg.head_dim
        heads = lambda t, n: t.view(2, 10, n, dh).transpose(1, 2)  # noqa: E731
        cos, sin = rope_cos_sin(torch.arange(10), rope_inv_freq(dh, 10000.0))
        q = apply_rope(heads(attn.q_proj(xn), 4), cos, sin)
        k = apply_rope(heads(attn.k_proj(xn), 2), cos, sin).repeat_interleave(2, 1)
        v = heads(attn.v_proj(xn), 2).repeat_interleave(2, 1)
        plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        plain = attn.o_proj(plain.transpose(1, 2).reshape(2, 10, -1))
        cache = LayerCache(model.cfg, model.empty_state(2)[0])
        ours = attn(xn, cos, sin, causal_bias(torch.arange(10), 10, group=2), cache)
    assert torch.allclose(ours, plain, atol=1e-5)


def test_variants_add_no_parameters():
    counts = {v: count_parameters(PSATransformer(preset_config("tiny", v))) for v in VARIANTS}
    assert len(set(counts.values())) == 1
    names = {v: sorted(PSATransformer(preset_config("tiny", v)).state_dict()) for v in VARIANTS}
    assert all(n == names["baseline"] for n in names.values())


def test_state_dict_uses_llama_names():
    names = set(PSATransformer(preset_config("tiny", num_hidden_layers=2)).state_dict())
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.post_attention_layernorm.weight"} <= names
    assert len(names) == 3 + 2 * 9


@pytest.mark.parametrize("name,low,high", [("tiny", 1e4, 1e6), ("psa-0.5m", 4e5, 6e5),
                                           ("psa-1m", 0.8e6, 1.2e6), ("psa-4m", 3.5e6, 4.5e6),
                                           ("psa-30m", 27e6, 33e6), ("psa-92m", 88e6, 96e6)])
def test_preset_parameter_counts(name, low, high):
    with torch.device("meta"):
        n = count_parameters(PSATransformer(preset_config(name)))
    assert low <= n <= high


def test_the_readme_names_every_preset():
    paragraph = (REPO / "README.md").read_text().split("Presets (", 1)[1].split("\n\n", 1)[0]
    assert [name for name in PRESETS if f"`{name}`" not in paragraph] == []


def test_twin_and_llama_config():
    cfg = preset_config("tiny", "symmetric", 0.5)
    twin = cfg.twin()
    assert (twin.gamma_q, twin.gamma_k, twin.variant) == (0.0, 0.0, "baseline")
    assert twin.to_llama_dict() == cfg.to_llama_dict()
    assert "gamma_k" not in cfg.to_llama_dict()
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("variant,gamma", [("baseline", 0.5), ("key-only", 0.0),
                                           ("symmetric", -1.0), ("no-such", None)])
def test_gamma_contradicting_variant_is_refused(variant, gamma):
    with pytest.raises(ConfigError):
        gammas_for(variant, gamma)


@pytest.mark.parametrize("fields", [dict(variant="symmetric", gamma_q=0.2, gamma_k=0.8),
                                    dict(variant="query-only", gamma_q=0.0, gamma_k=0.0),
                                    dict(hidden_size=60, num_attention_heads=8)])
def test_bad_config_is_refused(fields):
    with pytest.raises(ConfigError):
        ModelConfig(**fields)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset"):
        preset_config("psa-1b")


def run_chunked(model, tokens, chunks):
    state, outs, start = model.empty_state(1), [], 0
    for size in chunks:
        logits, state, _ = model.forward_with_state(tokens[:, start:start + size], state)
        outs.append(logits)
        start += size
    return torch.cat(outs, dim=1), state


@settings(max_examples=15, deadline=None)
@given(variant=st.sampled_from(VARIANTS), data=st.data())
def test_incremental_equals_full_sequence_under_random_chunkings(gqa_models, variant, data):
    model = gqa_models[variant]
    length = data.draw(st.integers(1, 24))
    chunks, left = [], length
    while left:
        chunks.append(data.draw(st.integers(1, left)))
        left -= chunks[-1]
    tokens = torch.randint(0, model.cfg.vocab_size, (1, length),
                           generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        full = model(tokens)
        chunked, state = run_chunked(model, tokens, chunks)
    scale = full.abs().max().item()
    assert (chunked - full).abs().max().item() <= 1e-4 * max(1.0, scale)
    assert state[0]["key"].shape == (1, model.cfg.num_key_value_heads, length,
                                     model.cfg.head_dim)
    if model.cfg.gamma_k:
        # The previous-key slot holds the RAW key at the last position.
        _, _, raw = model.forward_with_state(tokens, model.empty_state(1))
        assert torch.allclose(state[0]["prev_key"], raw[0]["key"][:, :, -1:], atol=1e-5)
    assert ("prev_key" in state[0]) == (model.cfg.gamma_k != 0)
    assert ("prev_query" in state[0]) == (model.cfg.gamma_q != 0)


def test_cache_shapes_equal_twin():
    psa = make_model("symmetric")
    twin = PSATransformer(psa.cfg.twin())
    tokens = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        _, s_psa, _ = psa.forward_with_state(tokens, psa.empty_state(1))
        _, s_twin, _ = twin.forward_with_state(tokens, twin.empty_state(1))
    for a, b in zip(s_psa, s_twin):
        for name in ("key", "value"):
            assert a[name].shape == b[name].shape and a[name].dtype == b[name].dtype
    assert set(s_psa[0]) - set(s_twin[0]) == {"prev_key", "prev_query"}


def test_tied_embeddings_share_one_matrix():
    untied = PSATransformer(preset_config("tiny"))
    tied = PSATransformer(preset_config("tiny", tie_word_embeddings=True))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert count_parameters(untied) - count_parameters(tied) == 64 * 64
    assert "lm_head.weight" in tied.state_dict()  # as LlamaForCausalLM's state_dict has it


def test_the_key_shear_on_the_scores_is_the_scores_of_the_sheared_keys():
    """The raw-key form's attention (`attend(..., key_shear=gamma)`) shears the scores along
    the key axis; by linearity that equals scoring the keys sheared from a zero start."""
    from psa_edge.model.ops import shear_scores

    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, 2, 3, 8, generator=generator)
    keys = torch.randn(1, 2, 7, 8, generator=generator)  # raw, positions 0..6
    sheared = shear(keys, torch.zeros(1, 2, 1, 8), 0.8)
    expected = query @ sheared.transpose(-1, -2)
    assert torch.allclose(shear_scores(query @ keys.transpose(-1, -2), 0.8), expected,
                          atol=1e-5)
