"""A gamma = 0 checkpoint IS a Llama checkpoint: Hugging Face's LlamaForCausalLM loads our
state_dict strictly from `to_llama_dict()` and gives the same logits (docs/reference/spec.md §1).
And tools/llama_cpp_bench.py, which runs that twin in llama.cpp: its GGUF's q/k row order for
llama.cpp's RoPE, and the findings its page states."""

import sys
import warnings

import torch

from conftest import REPO, make_model

sys.path.insert(0, str(REPO / "tools"))


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


def test_gguf_rows_make_llamas_pairwise_rope_compute_rotate_half():
    """llama.cpp rotates pairs (2i, 2i+1) by frequency i; Hugging Face rotates (i, i + dh/2)
    (numpy_reference.rope). The GGUF writer's row order makes the two give the same attention
    scores."""
    import numpy as np

    from llama_cpp_bench import interleaved_rope_rows
    from numpy_reference import rope

    heads, dh, dim, seq, theta = 2, 8, 16, 6, 10000.0
    rng = np.random.default_rng(0)
    wq, wk = rng.standard_normal((heads * dh, dim)), rng.standard_normal((heads * dh, dim))
    x = rng.standard_normal((seq, dim))

    def pairwise(v, theta):  # llama.cpp's LLAMA_ROPE_TYPE_NORM, v [S, dh]
        angle = np.arange(len(v))[:, None] * theta ** (-2.0 * np.arange(dh // 2) / dh)
        even, odd = v[:, 0::2], v[:, 1::2]
        out = np.empty_like(v)
        out[:, 0::2] = even * np.cos(angle) - odd * np.sin(angle)
        out[:, 1::2] = even * np.sin(angle) + odd * np.cos(angle)
        return out

    def scores(rotate, q_rows, k_rows):  # [heads, S, S]
        q, k = ((x @ w.T).reshape(seq, heads, dh) for w in (q_rows, k_rows))
        return np.stack([rotate(q[:, h], theta) @ rotate(k[:, h], theta).T
                         for h in range(heads)])

    reference = scores(rope, wq, wk)
    assert np.allclose(scores(pairwise, interleaved_rope_rows(wq, heads),
                              interleaved_rope_rows(wk, heads)), reference)
    assert not np.allclose(scores(pairwise, wq, wk), reference)  # the order matters


def test_llama_cpp_findings_are_computed_from_the_rows():
    from llama_cpp_bench import findings

    def rounds(preset, threads, *rates):  # (pp, tg) tokens/s of llama.cpp, runner, fused
        tests = [{"pp": pp, "tg": tg} for pp, tg in rates]
        return [{"preset": preset, "precision": "int4", "kind": "Q4_0", "threads": threads}
                | dict(zip(("llama.cpp", "xnnpack-runner", "onnx-fused"), tests))]

    text = findings(rounds("psa-4m", 1, (100, 100), (150, 85), (90, 70))
                    + rounds("psa-4m", 2, (200, 150), (300, 75), (180, 77))
                    + rounds("psa-30m", 1, (100, 100), (120, 99), (80, 50)))
    lines = text.splitlines()
    assert lines[0] == ("- Decode at least llama.cpp's (psa-4m: at least 0.8 of it): 1 of 3 rows; "
                        "short of it: psa-4m int4 2 threads 0.51, psa-30m int4 1 thread 0.99.")
    assert lines[1] == "- Prefill at least llama.cpp's: 3 of 3 rows."
    assert "ExecuTorch XNNPACK, runner form in 2 (2 at 1 thread)" in lines[2]
    assert "ONNX Runtime, fused form in 1 (0 at 1 thread)" in lines[2]
    assert lines[3].endswith("psa-30m: ONNX Runtime, fused form 0.80x; ExecuTorch XNNPACK, "
                             "runner form 1.20x.")
    # 2 threads over 1: llama.cpp 150/100, fused 77/70, runner 75/85
    assert lines[4].endswith("psa-4m 1.50x / 1.10x / 0.88x.")


