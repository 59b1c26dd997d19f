"""A gamma = 0 checkpoint IS a Llama checkpoint: Hugging Face's LlamaForCausalLM loads our
state_dict strictly from `to_llama_dict()` and gives the same logits (docs/spec.md §1). And
tools/llama_cpp_bench.py, which runs that twin in llama.cpp: its GGUF's q/k row order for
llama.cpp's RoPE, and the findings its page states; tools/int4_prefill.py, which times a
prefill's pieces beside llama.cpp's: its programs hold the model's own matrices and attention,
and its findings come from its rows."""

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


def test_the_int4_prefill_pieces_are_the_models_matrices_and_attention():
    from int4_prefill import attention_module, linears_module

    from psa_edge.model import preset_config
    from psa_edge.model.transformer import PSATransformer

    for preset in ("psa-4m", "psa-30m"):  # psa-30m: grouped-query attention
        cfg = preset_config(preset)
        model_shapes = sorted(m.weight.shape for m in PSATransformer(cfg).modules()
                              if isinstance(m, torch.nn.Linear))
        pieces = linears_module(preset, last_row=False)
        assert sorted(m.weight.shape for m in pieces.modules()
                      if isinstance(m, torch.nn.Linear)) == model_shapes
        hidden = torch.randn(1, 5, cfg.hidden_size)
        assert pieces(hidden).shape == (1, 5, cfg.vocab_size)
        assert linears_module(preset, last_row=True)(hidden).shape == (1, 1, cfg.vocab_size)
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        query = torch.randn(1, cfg.num_attention_heads, 5, head_dim)
        stream = torch.randn(1, cfg.num_key_value_heads, 5, head_dim)
        out = attention_module(preset)(query, stream, stream)
        assert out.shape == (1, 5, cfg.hidden_size) and torch.isfinite(out).all()


def test_int4_prefill_findings_are_computed_from_the_rows():
    from int4_prefill import findings, page, table

    def round_(threads, llama, session, program, every, last, attention, onnx, kernels):
        return {"threads": threads, "llama.cpp": llama,
                "xnnpack": {"session": session, "program": program, "linears_every_row": every,
                            "linears_last_row": last, "attention": attention},
                "onnx": {"prefill": onnx, "matmulnbits": kernels}}

    # Two rounds at 1 thread (the medians are their means) and one at 2.
    rounds = [round_(1, 2.0, 2.5, 2.4, 1.2, 0.8, 0.4, 3.0, 2.2),
              round_(1, 2.0, 2.5, 2.4, 1.2, 0.8, 0.4, 3.0, 1.8),
              round_(2, 1.0, 2.0, 1.9, 0.6, 0.4, 0.3, 2.0, 1.1)]
    lines = findings(rounds, [1, 2]).splitlines()
    # 1 thread: 2.0 / 2.5; rest 2.4 - 1.2 - 0.4; other rows 1.2 - 0.8; 2.0 / (2.5 - 0.4)
    assert lines[0] == (
        "- 1 thread: XNNPACK's prefill is 0.80 of llama.cpp's speed. Its program's call beyond "
        "the weight kernels and the attention takes 0.80 ms (0.40 of llama.cpp's whole "
        "prefill); the output projection of every row but the last takes 0.40 ms; less that, "
        "the prefill would be 0.95 of llama.cpp's speed (by subtraction, not measured). ONNX "
        "Runtime's MatMulNBits kernels alone take 1.00 of llama.cpp's whole prefill.")
    assert lines[1].startswith("- 2 threads: XNNPACK's prefill is 0.50 of llama.cpp's speed.")
    assert "takes 1.00 ms (1.00 of" in lines[1] and "would be 0.56 of" in lines[1]
    rows = table(rounds, [1, 2]).splitlines()
    assert rows[2] == ("| 1 | 2.00 | 2.50 / 2.40 | 1.20 / 0.80 | **0.40** | 0.40 | 3.00 | "
                       "2.00 | **1.00** |")
    # The block names what the rounds record, not the machine or commit it is rendered on.
    recorded = [r | {"preset": "psa-4m", "tokens": 128, "commit": "abc1234", "machine": "M"}
                for r in rounds]
    block = page(recorded)
    assert block.startswith("M, psa-edge at commit abc1234; psa-4m, ")
    assert "per 128-token prefill" in block and "medians of 1 round taking turns" in block
