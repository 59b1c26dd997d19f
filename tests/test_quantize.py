"""int8 and int4 quantization (docs/reference/spec.md §6): the exporter's builds and
`psa-edge quant-check`.

The shipped default model is the subject where accuracy matters (a good and a deliberately
damaged int8 build); tiny random models cover determinism, delegation, the shear's placement
in fp32 and cache parity with the twin. Each artifact is exported once per session."""

import copy
import json
import os

import numpy as np
import onnx
import pytest
import torch

from conftest import REPO, cli, copy_artifact, make_model, manifest_of, model_file
from exported import DEFAULT, DYNAMIC, INT4, INT4_G128, STATIC, TINY_LEN
from psa_edge.checks import reference as checks
from psa_edge.checks.reference import Reference, feed_chunks
from psa_edge.errors import ExportError
from psa_edge.export import pipeline
from psa_edge.export.pipeline import ExportRequest, run_export
from psa_edge.export.quantize import QuantSpec, onnx_shear_nodes
from psa_edge.io import sha256_file
from psa_edge.model.checkpoint import load_checkpoint, save_checkpoint
from psa_edge.runtime.session import open_session


@pytest.mark.parametrize("name,scheme,min_top1,size", [("onnx", "int8", 0.98, 0.35),
                                                      ("xnnpack", "int8", 0.98, 0.35),
                                                      ("int4", "int4", 0.90, 0.25),
                                                      ("xnnpack-int4", "int4", 0.90, 0.25),
                                                      ("fused-int4", "int4", 0.90, 0.25),
                                                      ("int8-block", "int8-block", 0.98,
                                                       0.40)])
def test_quant_check_passes_on_the_default_quantized_builds(default_int8, name, scheme,
                                                            min_top1, size):
    """Each scheme judged by its own default bounds (int4's top-1 floor is lower)."""
    result = cli("quant-check", DEFAULT, default_int8[name], "--samples", "12", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    m = report["metrics"]
    assert report["passed"] and report["quantization"] == scheme
    assert report["thresholds"]["min_top1"] == min_top1
    assert m["top1_agreement"] >= min_top1 and m["accuracy_delta_points"] >= -1.0
    assert 0 <= m["kl_mean"] <= m["kl_p99"] <= m["kl_max"] and m["max_abs_logit_error"] > 0
    manifest = manifest_of(default_int8[name])
    assert manifest["size_bytes"] <= size * 2_000_000  # the float artifacts are 2.0-2.1 MB


@pytest.mark.parametrize("name,bits,linears,block", [
    ("int4", 4, 7, 32), ("int8-block", 8, 7, 32), ("fused-int4", 4, 4, 32),
    ("int4-g128", 4, 7, 128)])
def test_onnx_block_schemes_are_block_wise_matmulnbits(default_int8, name, bits, linears, block):
    """Every weight MatMul (the layer's linears + lm_head; the fused form has q/k/v and
    gate/up as one MatMul each) became a MatMulNBits of the scheme's bits in blocks of 32, or
    of --group-size; no float weight matrix is left for a linear."""
    graph = onnx.load(str(model_file(default_int8[name]))).graph
    nbits = [{a.name: a.i for a in n.attribute} for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == linears + 1
    assert all(a["bits"] == bits and a["block_size"] == block and a["accuracy_level"] == 4
               for a in nbits)
    weights = {i.name for i in graph.initializer}
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    record = manifest_of(default_int8[name])["quantization"]
    assert record["scheme"] == ("int8-block" if bits == 8 else "int4")
    assert f"int{bits} symmetric, blocks of {block} along" in record["weights"]


def test_quant_check_fails_on_a_damaged_build(default_int8):
    result = cli("quant-check", DEFAULT, default_int8["damaged"], "--samples", "12")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL: top-1 agreement" in result.stderr or "FAIL: accuracy drop" in result.stderr


def test_calibration_is_deterministic_for_a_seed(int8, tiny_checkpoint, tmp_path):
    again = tmp_path / "again"
    run_export(ExportRequest(tiny_checkpoint, "onnx", again, TINY_LEN, quant=STATIC))
    digest = lambda name: sha256_file(model_file(name))  # noqa: E731
    assert digest(again) == digest(int8["onnx"])
    assert digest(int8["onnx-seed1"]) != digest(int8["onnx"])
    calibration = [manifest_of(int8[n])["quantization"]["calibration"]
                   for n in ("onnx", "onnx-seed1")]
    assert calibration[0]["samples"] == 32 and calibration[0]["split"] == "train"
    assert calibration[0]["tokens_sha256"] != calibration[1]["tokens_sha256"]


def test_runner_form_quantizes_with_its_llama_kernels(int8):
    """PT2E on the runner form: its int64 position arithmetic stays integer (PT2E's prepare
    turns a scalar added to a tensor into a float constant), the llama kernels survive the
    re-trace, and the program matches eager within the int8 tolerance."""
    m = manifest_of(int8["runner-dynamic"])
    assert m["parity"]["passed"] and m["quantization"]["scheme"] == "int8-dynamic"
    outside = m["delegation"]["ops_outside_delegate"]
    assert all(entry["why"] for entry in outside.values()), outside
    assert "llama_custom_sdpa_default" in outside and "auto_functionalized_v2" in outside
    logits = open_session(int8["runner-dynamic"]).feed(np.arange(20) % 64)
    assert logits.shape[0] == 20 and np.isfinite(logits).all()


def test_int8_keeps_cache_parity_with_its_twin(int8):
    tokens = np.arange(20) % 64
    psa, twin = open_session(int8["onnx"]), open_session(int8["onnx-twin"])
    for chunk in (tokens[:7], tokens[7:8], tokens[8:]):
        psa.feed(chunk)
        twin.feed(chunk)
        for key in twin.state:
            assert psa.state[key].shape == twin.state[key].shape
            assert psa.state[key].dtype == twin.state[key].dtype == np.float32
        a, b = psa.sizes(), twin.sizes()
        assert a["kv_cache_bytes"] == b["kv_cache_bytes"] > 0
        assert a["kv_cache_bytes_at_max"] == b["kv_cache_bytes_at_max"]
        assert a["extra_bytes"] == 2 * 2 * 16 * 4 and b["extra_bytes"] == 0


@pytest.mark.parametrize("build,linears", [("default static", 7 + 1), ("default int4", 7 + 1),
                                           ("tiny dynamic", 2 * 7 + 1)])
def test_quantized_linears_are_delegated(int8, default_int8, build, linears):
    """Static int8 and int4 on the default model (1 layer), dynamic on the tiny one (2 layers):
    every quantized linear runs inside XNNPACK."""
    m = manifest_of({"default static": default_int8["xnnpack"], "default int4":
                     default_int8["xnnpack-int4"], "tiny dynamic": int8["xnnpack-dynamic"]}[build])
    assert m["quantization"]["quantized_ops"] == {"linear.default": linears}
    outside = m["delegation"]["ops_outside_delegate"]
    assert all(entry["why"] for entry in outside.values()), outside
    for op in outside:
        assert not any(k in op for k in ("linear", "quantize", "choose_qparams", "mm")), op


def per_channel_4bit(model):
    """A copy of `model` whose linears hold their 4-bit symmetric rounding ([-8, 7], scale =
    max |w| / 7.5) with one scale per output channel."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for linear in (m for m in model.modules() if isinstance(m, torch.nn.Linear)):
            w = linear.weight
            scale = w.abs().amax(-1, keepdim=True) / 7.5
            linear.weight.copy_((w / scale).round().clamp(-8, 7) * scale)
    return model


@pytest.mark.parametrize("name,group,other", [("xnnpack-int4", 32, 128),
                                               ("xnnpack-int4-g128", 128, 32)])
def test_xnnpack_int4_runs_torchao_8da4w(default_int8, name, group, other):
    """XNNPACK's int4 logits follow torchao's own eager 8da4w model (4-bit weights in groups of
    32, or of --group-size, int8 activations per token): several times closer to it than to
    fp32, to 4-bit weights with one scale per output channel or to 8da4w of the other group
    size, so the program runs the group-wise weights of its group size."""
    from psa_edge.export.quantize import quantize_8da4w

    model = load_checkpoint(DEFAULT)[0].float().eval()
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, 96)
    built = open_session(default_int8[name]).feed(tokens)

    def rms_error(m):
        with torch.no_grad():
            logits = m(torch.from_numpy(tokens)[None])
        logits = logits[0] if isinstance(logits, tuple) else logits
        return float(np.sqrt(((built - logits[0].numpy()) ** 2).mean()))

    eager, channel = rms_error(quantize_8da4w(copy.deepcopy(model), group)), rms_error(
        per_channel_4bit(model))
    fp32, regrouped = rms_error(model), rms_error(quantize_8da4w(copy.deepcopy(model), other))
    assert eager < 0.2 * min(channel, fp32, regrouped), (eager, channel, fp32, regrouped)
    manifest = manifest_of(default_int8[name])
    assert f"groups of {group} along" in manifest["quantization"]["weights"]
    assert manifest["parity"]["min_agreement"] == 0.90


def test_onnx_static_int8_runs_integer_matmuls(int8, tmp_path):
    """ONNX Runtime's CPU provider fuses every quantized linear into a QLinearMatMul: no weight
    is dequantized on every call (with int8 activations it left most of them float)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(model_file(int8["onnx"])), options,
                         providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    weights = {i.name for i in optimized.graph.initializer}
    kinds = [n.op_type for n in optimized.graph.node]
    assert kinds.count("QLinearMatMul") == 2 * 7 + 1
    dequantized = [n.name for n in optimized.graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in weights]
    assert dequantized == []


def test_shear_stays_fp32_by_default_and_int8_when_asked(int8):
    kept = onnx.load(str(model_file(int8["onnx"])))
    producers = {o: n.op_type for n in kept.graph.node for o in n.output}
    shear = onnx_shear_nodes(kept)
    assert len(shear) == 3 * 2  # Sub, Mul, Add in each of 2 layers
    for node in (n for n in kept.graph.node if n.name in shear):
        assert not any(producers.get(i) == "DequantizeLinear" for i in node.input), node.name
    q_manifest = manifest_of(int8["onnx-shear"])["quantization"]
    assert q_manifest["quantized_ops"] == {"Add": 2, "MatMul": 15, "Mul": 2, "Sub": 2}
    assert not q_manifest["keep_shear_fp32"]
    quantized = onnx.load(str(model_file(int8["onnx-shear"])))  # same pre-processing: names
    producers = {o: n.op_type for n in quantized.graph.node for o in n.output}
    for node in (n for n in quantized.graph.node if n.name in shear):
        assert any(producers.get(i) == "DequantizeLinear" for i in node.input), node.name


def test_xnnpack_shear_int8_when_asked(int8):
    """`--quantize-shear` on XNNPACK: the ShearQuantizer annotates each layer's Sub, Mul, Add
    (2 layers), the export-time parity probe passed, and chunked decoding of the int8 program
    agrees with its all-at-once logits."""
    manifest = manifest_of(int8["xnnpack-shear"])
    quantized = {op.split(".")[0]: n for op, n in manifest["quantization"]["quantized_ops"].items()}
    assert quantized == {"add": 2, "linear": 2 * 7 + 1, "mul": 2, "sub": 2}
    assert not manifest["quantization"]["keep_shear_fp32"] and manifest["parity"]["passed"]
    session = open_session(int8["xnnpack-shear"])
    tokens = np.random.default_rng(4).integers(0, 64, size=24)
    whole = feed_chunks(session, tokens, [24])
    assert np.abs(feed_chunks(session, tokens, [1] * 8 + [16]) - whole).max() < 1e-3


def test_int8_incremental_decoding_holds_under_chunking(int8, tiny_checkpoint):
    """Static int8: any chunking gives the int8 all-at-once logits (its scales are fixed), and
    those stay within the int8 bounds of the float reference."""
    session = open_session(int8["onnx"])
    tokens = np.random.default_rng(3).integers(0, 64, size=40)
    whole = feed_chunks(session, tokens, [40])
    for chunks in ([1] * 40, [13, 1, 20, 6]):
        assert np.abs(feed_chunks(session, tokens, chunks) - whole).max() < 1e-3
    reference = Reference.of_checkpoint(tiny_checkpoint).logits(tokens)
    assert np.abs(whole - reference).max() <= checks.tolerance(reference, "int8")


@pytest.mark.parametrize("hidden,spec", [(48, INT4), (64, INT4_G128)])
def test_xnnpack_int4_refuses_linears_not_in_whole_groups(tmp_path, hidden, spec):
    """8da4w groups 32 inputs per scale (or --group-size): a hidden size of 48, or of 64 in
    groups of 128, is refused by name before anything is written."""
    path = tmp_path / "odd.pt"
    save_checkpoint(path, make_model("key-only", hidden_size=hidden,
                                     intermediate_size=2 * hidden),
                    {"task": {"name": "ih-sht", "params": {"seq_len": 64, "alphabet": 64}}})
    with pytest.raises(ExportError, match=f"multiple of its group size {spec.group_size}; "
                                          f".*takes {hidden}"):
        run_export(ExportRequest(path, "xnnpack", tmp_path / "m", TINY_LEN, quant=spec))
    assert sorted(os.listdir(tmp_path)) == ["odd.pt", "odd.pt.json"]


def test_failed_int8_parity_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    from psa_edge.checks import reference

    monkeypatch.setattr(reference, "INT8_MIN_AGREEMENT", 1.01)
    with pytest.raises(ExportError, match="argmax agreement"):
        run_export(ExportRequest(tiny_checkpoint, "onnx", tmp_path / "m", TINY_LEN,
                                 quant=STATIC))
    assert os.listdir(tmp_path) == []


def test_group_size_names_the_default_output():
    """Two group sizes of one scheme do not overwrite each other's default folder."""
    checkpoint = REPO / "m" / "model.pt"
    assert ExportRequest(checkpoint, "onnx", quant=INT4).default_output().name == "model-onnx-int4"
    assert (ExportRequest(checkpoint, "xnnpack", form="runner", quant=INT4_G128)
            .default_output().name == "model-xnnpack-runner-int4-g128")


@pytest.mark.parametrize("spec,target,message", [
    (QuantSpec("int2"), "onnx", "unknown quantization"),
    (STATIC, "portable", "its kernels"),
    (INT4, "portable", "its kernels"),
    (QuantSpec("int8-block"), "xnnpack", "use --target onnx"),
    (QuantSpec("int4", keep_shear_fp32=False), "onnx", "dynamic"),
    (QuantSpec("int8", calibration_samples=0), "onnx", "must be positive"),
    (QuantSpec("int8-dynamic", keep_shear_fp32=False), "onnx", "dynamic"),
    (QuantSpec("int4", group_size=48), "onnx", "power of two of at least 32, got 48"),
    (QuantSpec("int8-block", group_size=16), "onnx", "power of two of at least 32, got 16"),
    (QuantSpec("int8-dynamic", group_size=64), "onnx", "block-wise schemes"),
])
def test_export_int8_bad_input(tiny_checkpoint, tmp_path, spec, target, message):
    stages = []
    with pytest.raises(ExportError, match=message):
        run_export(ExportRequest(tiny_checkpoint, target, tmp_path / "m", quant=spec),
                   stages.append)
    assert os.listdir(tmp_path) == [] and stages == []  # refused before the first stage


@pytest.mark.parametrize("args,message", [
    (["--quantize", "int2"], "unknown quantization"),
    (["--group-size", "64"], "--group-size needs --quantize int4 or int8-block"),
    (["--quantize", "int4", "--group-size", "0"], "power of two of at least 32, got 0")])
def test_export_int8_bad_input_cli(tiny_checkpoint, tmp_path, args, message):
    """The CLI's side of the contract: one line on stderr, exit 2, nothing written."""
    result = cli("export", tiny_checkpoint, "-o", tmp_path / "m", "--target", "onnx", *args)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path) == []


def test_quantizing_without_held_out_data_is_refused_before_the_trace(tmp_path):
    """Every scheme's parity probe (and static calibration) needs held-out data: a checkpoint
    that records no task is refused in the load stage, before any trace, nothing written."""
    path = tmp_path / "no-task.pt"
    save_checkpoint(path, make_model("key-only"), {})
    for spec in (STATIC, DYNAMIC, INT4):
        stages = []
        with pytest.raises(ExportError, match="records no task: pass --text PATH"):
            run_export(ExportRequest(path, "onnx", tmp_path / "m", quant=spec), stages.append)
        assert stages == ["load"]
    result = cli("export", path, "--target", "onnx", "--text", tmp_path, "-o", tmp_path / "m")
    assert result.returncode == 2 and "--text is held-out data for --quantize" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["no-task.pt", "no-task.pt.json"]


def write_corpus(folder):
    """60 generated documents: a validation split of a few of them (5% by content hash)."""
    folder.mkdir()
    words = np.array(["def", "return", "x", "y", "(", ")", ":", "print", "os", "*", "2", "\n"])
    rng = np.random.default_rng(0)
    for i in range(60):
        (folder / f"doc{i}.py").write_text(" ".join(rng.choice(words, 300)))
    return folder


def test_any_language_model_quantizes_and_checks_on_text(imported, tmp_path):
    """An imported model records no task: static int8 calibrates on --text, and quant-check
    --text scores that text's validation split, its float perplexity the one computed here
    from the checkpoint on the same windows."""
    from psa_edge.tasks.text import TextTask, read_corpus

    text, out = write_corpus(tmp_path / "corpus"), tmp_path / "int8"
    result = cli("export", imported["psa"], "--target", "onnx", "--quantize", "int8", "--text",
                 text, "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    calibration = json.loads(result.stdout)["quantization"]["calibration"]
    assert calibration["task"]["name"] == "text" and calibration["samples"] == 32
    assert calibration["task"]["params"]["corpus"]["documents"] == 60
    check = cli("quant-check", imported["psa"], out, "--text", text, "--samples", "4",
                "--seq-len", "32", "--json")
    assert check.returncode in (0, 1), check.stderr  # the verdict is the thresholds' business
    report = json.loads(check.stdout)
    assert report["task"]["name"] == "text" and report["tokens_per_sample"] == 32
    model, _ = load_checkpoint(imported["psa"])
    inputs, targets = TextTask(read_corpus([text]), model.tokenizer, 32).sample(
        "test", 4, 1234)
    with torch.no_grad():
        log_p = torch.log_softmax(model(torch.from_numpy(inputs)).double(), -1)
    nll = -log_p.gather(-1, torch.from_numpy(targets)[..., None]).mean()
    assert report["metrics"]["target_perplexity_float"] == pytest.approx(float(nll.exp()),
                                                                         rel=1e-5)


def test_quant_check_bad_input(int8, tiny_checkpoint, tmp_path):
    from psa_edge.checks import quant_check
    from psa_edge.errors import PsaEdgeError

    tampered = copy_artifact(int8["onnx"], tmp_path / "t")
    with open(tampered / "model.onnx", "ab") as f:
        f.write(b"x")
    for args, message in [((tiny_checkpoint, tampered), "does not match"),
                          ((DEFAULT, int8["onnx"]), "was not exported from"),
                          ((tiny_checkpoint, int8["onnx"], "mqar"), "vocabulary"),
                          ((tiny_checkpoint, int8["onnx"], None, 0), "at least 1"),
                          ((tiny_checkpoint, int8["onnx"], "mqar", 4, 0, (str(tmp_path),)),
                           "--task or --text, not both")]:
        with pytest.raises(PsaEdgeError, match=message):
            quant_check.prepare(*args)
    result = cli("quant-check", DEFAULT, int8["onnx"])
    assert result.returncode == 2 and "was not exported from" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_int8_decode_method_has_no_shift_ops(tiny_checkpoint, tmp_path):
    """The int8 `decode` method (S = 1) is re-traced from the converted module with the shear's
    shift reattached as `ops.previous`, so, as in fp32, it concatenates
    only onto the caches and slices only the RoPE halves; `forward` keeps the general shift."""
    req = pipeline.check_request(ExportRequest(tiny_checkpoint, "xnnpack", tmp_path / "m",
                                               TINY_LEN, quant=STATIC))
    model, _, task = pipeline.load(req)
    model = pipeline.transform(model, req)
    methods, _ = pipeline.quantize(pipeline.export(model, req), model, task, req)

    def sequence_ops(method):  # cat / slice along the sequence dim (-2) of a method
        nodes = [n for n in methods[method].program.graph.nodes if n.op == "call_function"]
        aten = torch.ops.aten
        return {kind: sum(1 for n in nodes if n.target == op and len(n.args) > 1
                          and n.args[1] % 4 == 2 and n.meta["val"].dim() == 4)
                for kind, op in (("cat", aten.cat.default), ("slice", aten.slice.Tensor))}

    layers = model.cfg.num_hidden_layers
    assert sequence_ops("decode") == {"cat": 2 * layers, "slice": 0}
    # forward: per layer the key and value cache appends and the shift's concat, and the shift's
    # slice (the next slot is read by the runtime from the raw-key output, no op in the graph)
    assert sequence_ops("forward") == {"cat": 3 * layers, "slice": layers}
