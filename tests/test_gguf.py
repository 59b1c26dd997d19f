"""GGUF in: small GGUF files written here with the gguf package, as llama.cpp's converter writes
a Llama (its query / key row permutation, its metadata, its byte-level BPE vocabulary), imported
with `import-hf` and checked against the model they were written from: the weights (exactly at
F32, to the format's rounding when quantized), the logits, the tokenizer's encodings, and bad
files refused in one line."""

import json

import numpy as np
import pytest
import torch

from conftest import REPO, cli
from psa_edge.hf.convert import import_hf
from psa_edge.model.checkpoint import load_checkpoint, read_checkpoint

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n" \
           "{% endfor %}"
TEXTS = ["def f(x):\n    return x * 2\n", "import os 1234\n", "<|im_start|>user\nhi<|im_end|>"]


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute): per head, rows in
    halves [2, j] become pairs [j, 2]."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, -1).swapaxes(1, 2) \
        .reshape(rows.shape)


@pytest.fixture(scope="module")
def source():
    """A random GQA Llama (2 layers, untied head) and a byte-level BPE with chat tokens."""
    from conftest import make_model
    from psa_edge.tokenizer import train_bpe

    tokenizer = train_bpe(["def f(x):\n    return x * 2\n" * 40, "import os\n" * 40], 300)
    tokenizer.hf.add_special_tokens(SPECIAL[1:])
    model = make_model("baseline", vocab_size=302, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=2, tie_word_embeddings=False)
    return model, tokenizer


# K-quant super-blocks of 256 weights: bytes per block and where its float16 scales sit. The
# gguf package dequantizes them but cannot quantize, so these are random valid blocks.
K_BLOCKS = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}


def k_blocks(shape, kind: str) -> np.ndarray:
    """Random `kind` blocks for a `[rows, columns]` weight, with finite small scales."""
    size, scales = K_BLOCKS[kind]
    rng = np.random.default_rng(len(shape) + shape[0])
    blocks = rng.integers(0, 256, (shape[0], shape[1] // 256, size), dtype=np.uint8)
    for at in scales:
        blocks[..., at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return blocks.reshape(shape[0], -1)


def write_gguf(path, model, tokenizer, kind="F32", pre="smollm", **overrides):
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import quantize

    cfg = model.cfg
    writer = gguf.GGUFWriter(str(path), overrides.pop("arch", "llama"))
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(overrides.pop("rope_dims", cfg.head_dim))
    vocab = tokenizer.hf.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) for m in json.loads(tokenizer.hf.to_str())["model"]["merges"]]
    writer.add_tokenizer_model(overrides.pop("tokenizer_model", "gpt2"))
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab.get("<|im_end|>", vocab["<|endoftext|>"]))
    writer.add_add_bos_token(False)
    writer.add_chat_template(TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, tensor in model.state_dict().items():
        values = tensor.detach().numpy().astype(np.float32)
        if name.startswith("model.layers."):
            i, rest = name.split(".")[2], ".".join(name.split(".")[3:-1])
            gname = f"blk.{i}.{layer[rest]}.weight"
            if rest in ("self_attn.q_proj", "self_attn.k_proj"):
                values = permute(values, cfg.num_attention_heads if "q_proj" in rest
                                 else cfg.num_key_value_heads)
        else:
            gname = names[name]
        if values.ndim == 2 and kind in K_BLOCKS:
            values = k_blocks(values.shape, kind)
            writer.add_tensor(gname, values, raw_dtype=T[kind])
            continue
        if values.ndim == 1 or kind == "F32":
            writer.add_tensor(gname, values)
        elif kind == "F16":
            writer.add_tensor(gname, values.astype(np.float16))
        else:
            writer.add_tensor(gname, quantize(values, T[kind]), raw_dtype=T[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_f32_gguf_imports_to_the_model_it_was_written_from(source, tmp_path):
    model, tokenizer = source
    path = write_gguf(tmp_path / "m.gguf", model, tokenizer, pre="gpt2")
    result = cli("import-hf", path, "-o", tmp_path / "m.pt")
    assert result.returncode == 0, result.stderr
    imported, _ = load_checkpoint(tmp_path / "m.pt")
    ours = model.state_dict()
    assert all(torch.equal(imported.state_dict()[k], ours[k]) for k in ours)
    ids = torch.tensor([[5, 9, 33, 7, 120, 250, 3]])
    with torch.no_grad():
        assert torch.equal(imported(ids), model(ids))
    # The rebuilt tokenizer encodes as the one written (GPT-2's pre-tokenizer), chat tokens
    # whole.
    for text in TEXTS:
        assert imported.tokenizer.encode(text) == tokenizer.encode(text), text
    imported_meta = read_checkpoint(tmp_path / "m.pt")["metadata"]["imported"]
    assert imported_meta["chat"] == {"chat_template": TEMPLATE, "add_bos": False}
    assert imported.cfg.eos_token_id == tokenizer.hf.token_to_id("<|im_end|>")


@pytest.mark.parametrize("kind,tol", [("F16", 2e-3), ("BF16", 2e-2), ("Q8_0", 2e-2),
                                      ("Q4_0", 0.3), ("Q4_1", 0.2)])
def test_quantized_ggufs_import_dequantized(source, tmp_path, kind, tol):
    """Each 2-D weight within the format's rounding of the source's (relative to the tensor's
    largest magnitude), the norms exact; and equal to the gguf package's own dequantization."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize, quantize

    model, tokenizer = source
    import_hf(write_gguf(tmp_path / f"m-{kind}.gguf", model, tokenizer, kind), tmp_path / "m.pt")
    imported = load_checkpoint(tmp_path / "m.pt")[0].state_dict()
    for name, weight in model.state_dict().items():
        got, want = imported[name].numpy(), weight.numpy()
        if want.ndim == 1:
            assert np.array_equal(got, want), name
            continue
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), name
    down = model.state_dict()["model.layers.0.mlp.down_proj.weight"].numpy()
    expected = (down.astype(np.float16).astype(np.float32) if kind == "F16"
                else dequantize(quantize(down, T[kind]), T[kind]))
    assert np.array_equal(imported["model.layers.0.mlp.down_proj.weight"].numpy(), expected)


@pytest.mark.parametrize("overrides,message", [
    (dict(arch="gpt2"), "architecture 'gpt2' is not llama"),
    (dict(pre="qwen2"), "pre-tokenizer 'qwen2' is not one psa-edge rebuilds"),
    (dict(tokenizer_model="llama"), "tokenizer model 'llama' is not byte-level BPE"),
    (dict(rope_dims=8), "rope.dimension_count = 8 is not hidden / heads"),
])
def test_a_gguf_psa_edge_cannot_express_is_refused_in_one_line(source, tmp_path, overrides,
                                                                 message):
    model, tokenizer = source
    path = write_gguf(tmp_path / "bad.gguf", model, tokenizer, **overrides)
    result = cli("import-hf", path, "-o", tmp_path / "m.pt")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.pt").exists()


def test_a_truncated_gguf_is_refused_in_one_line(source, tmp_path):
    model, tokenizer = source
    path = write_gguf(tmp_path / "m.gguf", model, tokenizer)
    path.write_bytes(path.read_bytes()[:2000])
    result = cli("import-hf", path, "-o", tmp_path / "m.pt")
    assert result.returncode == 2 and "not a GGUF file the gguf package reads" in result.stderr
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("kind", K_BLOCKS)
def test_k_quant_ggufs_import_as_the_gguf_package_dequantizes_them(tmp_path, kind):
    """Q4_K and Q6_K (256-weight super-blocks, so a 256-wide model): each weight is what the
    gguf package dequantizes from the bytes written, the query and key rows back in Hugging
    Face's order (the inverse of `permute`, found here by permuting row indices)."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize

    from conftest import make_model
    from psa_edge.tokenizer import train_bpe

    tokenizer = train_bpe(["abc abd abe " * 30], 260)
    model = make_model("baseline", vocab_size=260, hidden_size=256, intermediate_size=256,
                       num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    path = write_gguf(tmp_path / "k.gguf", model, tokenizer, kind, pre="gpt2")
    import_hf(path, tmp_path / "k.pt")
    imported = load_checkpoint(tmp_path / "k.pt")[0].state_dict()
    written = {t.name: dequantize(t.data, T[kind]) for t in gguf.GGUFReader(str(path)).tensors
               if t.tensor_type.name == kind}
    for gname, heads, name in (("blk.0.attn_q.weight", 4, "self_attn.q_proj"),
                               ("blk.0.attn_k.weight", 2, "self_attn.k_proj"),
                               ("blk.0.ffn_down.weight", None, "mlp.down_proj")):
        rows = written[gname]
        if heads:
            order = permute(np.arange(rows.shape[0])[:, None], heads)[:, 0]
            rows = rows[np.argsort(order)]
        assert np.array_equal(imported[f"model.layers.0.{name}.weight"].numpy(), rows), name


def test_the_smollm_pre_tokenizer_splits_digits_as_smollm2s_tokenizer_does(source, tmp_path):
    """`tokenizer.ggml.pre` smollm: llama.cpp splits every digit apart before GPT-2's split;
    SmolLM2's own tokenizer.json says the same as Digits(individual) then ByteLevel. The
    rebuilt tokenizer encodes as that layout built here from the source's vocabulary."""
    from psa_edge.tokenizer import Tokenizer

    model, tokenizer = source
    import_hf(write_gguf(tmp_path / "m.gguf", model, tokenizer, pre="smollm"), tmp_path / "m.pt")
    imported = load_checkpoint(tmp_path / "m.pt")[0].tokenizer
    layout = json.loads(tokenizer.hf.to_str())
    layout["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True}]}
    smollm = Tokenizer(json.dumps(layout))
    for text in TEXTS + ["x = 12345 + 6\n", "v2.0 is 2024"]:
        assert imported.encode(text) == smollm.encode(text), text
    assert imported.encode("1234") == [tokenizer.hf.token_to_id(c) for c in "1234"]


def test_the_chat_template_travels_into_every_artifact_and_renders_as_transformers_does(
        source, tmp_path):
    """GGUF -> checkpoint -> ONNX artifact: tokenizer_config.json carries the template, so
    transformers' own `apply_chat_template` on the artifact folder gives the token ids that
    `generate --chat` feeds; a conversation file renders the same way, and the torch-free
    runtime renders it too."""
    import subprocess
    import sys

    from transformers import PreTrainedTokenizerFast

    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.runtime.run import Prompt
    from psa_edge.runtime.session import open_session

    model, tokenizer = source
    import_hf(write_gguf(tmp_path / "m.gguf", model, tokenizer, pre="gpt2"), tmp_path / "m.pt")
    run_export(ExportRequest(tmp_path / "m.pt", "onnx", tmp_path / "onnx", 64))
    config = json.loads((tmp_path / "onnx" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == TEMPLATE
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "def f(x): 12"}]
    theirs = PreTrainedTokenizerFast.from_pretrained(str(tmp_path / "onnx"))
    session = open_session(tmp_path / "onnx")
    (tmp_path / "chat.json").write_text(json.dumps(conversation))
    assert Prompt(chat_file=tmp_path / "chat.json").tokens(session.tokenizer) == \
        theirs.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    one = [{"role": "user", "content": "hi"}]
    expected = theirs.apply_chat_template(one, add_generation_prompt=True, tokenize=True)
    script = ("import sys\nclass NoTorch:\n    def find_spec(self, name, path=None, "
              "target=None):\n        if name.split('.')[0] == 'torch':\n"
              "            raise ImportError('torch is blocked')\n"
              "sys.meta_path.insert(0, NoTorch())\nfrom psa_edge.cli import main\n"
              f"sys.argv = ['psa-edge', 'generate', {str(tmp_path / 'onnx')!r}, '--chat', "
              "'hi', '-n', '3', '--json']\nmain()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["prompt_tokens"] == len(expected)
    for args, message in ((["--chat-file", tmp_path / "m.gguf"], "cannot read --chat-file"),
                          (["--chat", "hi", "--prompt", "x"], "give exactly one of")):
        refused = cli("generate", tmp_path / "onnx", *args)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    plain = cli("generate", REPO / "models" / "psa-default.pt", "--chat", "hi")
    assert plain.returncode == 2 and "the model has no chat template" in plain.stderr
