"""Export (docs/reference/spec.md §2-§4, §8): every target against eager, the shear in the graphs,
twin parity, ExecuTorch's own TextLLMRunner, inspect, and bad input. Artifacts are exported once a
session."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from conftest import (CASES, MAX_LEN, REPO, assert_umask_modes, cli, copy_artifact, make_model,
                      manifest_of, model_file)
from psa_edge.checks import reference as checks
from psa_edge.checks.reference import Reference, feed_chunks
from psa_edge.errors import ArtifactError, ExportError, PsaEdgeError
from psa_edge.export.pipeline import STAGES, ExportRequest, export, run_export, transform
from psa_edge.io import sha256_file
from psa_edge.runtime.session import open_session


def eager(checkpoints, name):
    variant, _, twin, _ = CASES[name]
    from psa_edge.model.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoints[variant])
    return transform(model, ExportRequest(checkpoints[variant], "onnx", twin=twin))


@pytest.mark.parametrize("name", ["onnx", "onnx-twin", "xnnpack", "xnnpack-twin", "portable",
                                  "runner", "raw-key"])
def test_artifact_matches_eager_under_random_chunkings(artifacts, checkpoints, name):
    session = open_session(artifacts[name])
    model = eager(checkpoints, name)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, size=40)
    expected = Reference(model).logits(tokens)
    tol = 1e-4 * max(1.0, np.abs(expected).max())
    for chunks in [checks.random_chunks(rng, 40) for _ in range(3)] + [[40], [1] * 40]:
        assert np.abs(feed_chunks(session, tokens, chunks) - expected).max() <= tol, chunks
    # The previous-key slot after the sequence is the RAW key of its last position.
    if "prev_key" in session.io.state_fields and hasattr(session, "state"):
        with torch.no_grad():
            _, _, raw = model.forward_with_state(torch.from_numpy(tokens)[None],
                                                 model.empty_state(1))
        assert np.allclose(session.state["1.prev_key"], raw[1]["key"][:, :, -1:].numpy(),
                           atol=1e-5)


def test_runner_form_takes_the_slot_from_its_window(artifacts, checkpoints):
    """A new sequence at input_pos 0 in the same loaded program starts from the zero state; a
    call at an earlier position continues from the cache rows and window row before it."""
    model = eager(checkpoints, "runner")
    tokens = np.random.default_rng(1).integers(0, 64, size=30)
    expected = Reference(model).logits(tokens)
    tol = 1e-4 * max(1.0, np.abs(expected).max())
    program = open_session(artifacts["runner"]).program
    program.run(tokens[::-1].copy(), 0)
    assert np.abs(program.run(tokens, 0) - expected).max() <= tol
    program.run(tokens[:5], 20)  # overwrite positions 20..24 with other tokens
    assert np.abs(program.run(tokens[20:], 20) - expected[20:]).max() <= tol


def test_manifest_records_parity_and_provenance(artifacts, checkpoints):
    m = manifest_of(artifacts["xnnpack"])
    from psa_edge.io import sha256_file

    assert m["source_checkpoint"]["sha256"] == sha256_file(checkpoints["symmetric"])
    assert m["parity"]["passed"] and m["parity"]["max_abs_logit_error"]["token_by_token"] < 1e-4
    folder = artifacts["xnnpack"]
    assert {"model.pte", "tokenizer.json", "tokenizer_config.json"} <= set(m["files"])
    assert m["files"] == {p.name: sha256_file(p) for p in folder.iterdir()
                          if p.name != "manifest.json"}
    assert sorted(os.listdir(folder)) == ["manifest.json", "model.pte", "reference.npz",
                                          "tokenizer.json", "tokenizer_config.json"]
    assert_umask_modes(artifacts["xnnpack"], *artifacts["xnnpack"].iterdir())
    assert m["versions"]["executorch"] == "1.4.1" and m["versions"]["torch"].startswith("2.13")
    assert m["gamma_q"] == m["gamma_k"] == 0.8 and m["variant"] == "symmetric"
    assert manifest_of(artifacts["xnnpack-twin"])["gamma_k"] == 0.0


def test_raw_key_form_has_plain_llama_io_and_caches_the_raw_keys(artifacts, checkpoints,
                                                                  tmp_path):
    """The raw-key graph's I/O is a plain Llama decoder's (the twin's, plus the mask and the
    positions clients feed), its cache after a sequence holds the eager model's raw post-RoPE
    keys, and a model with a query shear is refused before anything is written."""
    import onnx

    graph = onnx.load(artifacts["raw-key"] / "model.onnx").graph
    twin = onnx.load(artifacts["onnx-twin"] / "model.onnx").graph
    twin_inputs = [i.name for i in twin.input]
    assert [i.name for i in graph.input] == (twin_inputs[:1] + ["attention_mask", "position_ids"]
                                             + twin_inputs[1:])
    assert [o.name for o in graph.output] == [o.name for o in twin.output]
    tokens = np.random.default_rng(3).integers(0, 64, size=11)
    session = open_session(artifacts["raw-key"])
    session.feed(tokens[:4])
    session.feed(tokens[4:])
    model = eager(checkpoints, "raw-key")
    with torch.no_grad():
        _, _, raws = model.forward_with_state(torch.from_numpy(tokens)[None], model.empty_state())
    for layer, raw in enumerate(raws):
        assert np.abs(session.state[f"{layer}.key"] - raw["key"].numpy()).max() <= 1e-5
    assert set(session.state) == {"0.key", "0.value", "1.key", "1.value"}
    with pytest.raises(PsaEdgeError, match="query shear .* needs the explicit-state form"):
        run_export(ExportRequest(checkpoints["symmetric"], "onnx", tmp_path / "q", MAX_LEN,
                                 form="raw-key"))
    assert not (tmp_path / "q").exists()


def test_onnx_side_files_follow_the_form(artifacts):
    """Every ONNX folder carries the Hugging Face configs, without an auto_map to code it does
    not hold; genai_config.json only where onnxruntime-genai feeds every input: the twin's
    explicit-state graph, not the PSA one's slots or the fused form's input_pos (the raw-key
    form's: tests/test_clients.py)."""
    for name, genai in (("onnx", False), ("onnx-twin", True), ("fused", False)):
        files = set(manifest_of(artifacts[name])["files"])
        assert {"model.onnx", "config.json", "generation_config.json"} <= files
        assert ("genai_config.json" in files) == genai
        assert (artifacts[name] / "genai_config.json").exists() == genai
        config = json.loads((artifacts[name] / "config.json").read_text())
        assert config["model_type"] == "llama" and "auto_map" not in config


def onnx_shears(path):
    """(stream, gamma) for every Sub -> Mul(gamma) -> Add pattern fed by a RoPE output and the
    sequence shift of that same output behind its carried-in slot."""
    model = onnx.load(str(model_file(path)))
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consumers = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            constants[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)

    def ancestors(name, seen=None):
        seen = set() if seen is None else seen
        node = producer.get(name)
        if node is None or node.name in seen:
            return seen
        seen.add(node.name)
        for i in node.input:
            ancestors(i, seen)
        return seen

    types = {n.name: n.op_type for n in graph.node}
    found = []
    for sub in (n for n in graph.node if n.op_type == "Sub"):
        stream, shifted = sub.input
        rope_types = {types[a] for a in ancestors(stream)}
        shift = producer.get(shifted)
        if not ({"Cos", "Sin"} <= rope_types and shift is not None and shift.op_type == "Slice"):
            continue
        concat = producer[shift.input[0]]
        slot = [i for i in concat.input if i.startswith("past_key_values.")]
        assert concat.op_type == "Concat" and stream in concat.input and len(slot) == 1
        for mul in (c for c in consumers[sub.output[0]] if c.op_type == "Mul"):
            gamma = [float(constants[i]) for i in mul.input if i in constants]
            adds = [c for c in consumers[mul.output[0]] if c.op_type == "Add"
                    and stream in c.input]
            if gamma and adds:
                found.append((slot[0].rsplit(".", 1)[1], round(gamma[0], 6)))
    return sorted(found)


def test_onnx_graph_has_shear_as_sub_mul_add_after_rope(artifacts):
    assert onnx_shears(artifacts["onnx"]) == sorted(
        [("prev_key", 0.8), ("prev_query", 0.8)] * 2)
    assert onnx_shears(artifacts["onnx-twin"]) == []
    ops = {n.op_type for n in onnx.load(str(model_file(artifacts["onnx"]))).graph.node}
    assert not ops - {"Add", "Cast", "Concat", "Cos", "Div", "Equal", "Expand", "Gather",
                      "LessOrEqual", "MatMul", "Mul", "Neg", "Not", "Pow", "Range", "Reciprocal",
                      "ReduceMean", "Reshape", "Shape", "Sigmoid", "Sin", "Slice", "Softmax",
                      "Sqrt", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze", "Where",
                      "ConstantOfShape", "Constant"}, "unexpected (custom?) op in the graph"


def test_onnx_checker_full_and_empty_past(artifacts):
    load = lambda name: onnx.load(str(model_file(artifacts[name])))  # noqa: E731
    onnx.checker.check_model(load("onnx"), full_check=True)
    session = open_session(artifacts["onnx"])
    logits = feed_chunks(session, np.array([1, 2, 3]), [3])  # P = 0 first call
    assert logits.shape == (3, 64) and session.state["0.key"].shape == (1, 2, 3, 16)
    names = [i.name for i in load("onnx").graph.input]
    assert names[:5] == ["input_ids", "past_key_values.0.key", "past_key_values.0.value",
                         "past_key_values.0.prev_key", "past_key_values.0.prev_query"]
    # The slots are read from the raw outputs; the twin's I/O is a plain Llama decoder's.
    cache_out = ["logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    outputs = {name: [o.name for o in load(name).graph.output] for name in ("onnx", "onnx-twin")}
    assert outputs["onnx"] == cache_out + ["present.raw_key", "present.raw_query"]
    assert outputs["onnx-twin"] == cache_out
    assert [i.name for i in load("onnx-twin").graph.input] == [
        "input_ids", "past_key_values.0.key", "past_key_values.0.value",
        "past_key_values.1.key", "past_key_values.1.value"]


def edge_shears(checkpoint, variant, target):
    """Sub -> Mul(gamma) -> Add chains downstream of cos/sin in the ExecuTorch edge graph, and
    whether each sits inside the XNNPACK delegate."""
    from psa_edge.export.executorch_target import to_edge
    from psa_edge.model.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoint)
    req = ExportRequest(checkpoint, target, max_seq_len=MAX_LEN)
    edge = to_edge(export(transform(model, req), req)["forward"].program, target == "xnnpack")
    gm = edge.exported_program().graph_module
    if target == "xnnpack":  # the partitioned graph: look inside each delegate's original graph
        from executorch.exir.lowered_backend_module import get_lowered_submodules

        graphs = [(True, lowered.original_module.graph)
                  for _, lowered, _ in get_lowered_submodules(gm)] + [(False, gm.graph)]
    else:
        graphs = [(False, gm.graph)]
    found, outside_arith = [], []
    for delegated, graph in graphs:
        for node in graph.nodes:
            name = str(node.target)
            if not delegated and any(op in name for op in ("linear", "bmm", "softmax", "sub",
                                                           "mul.Tensor", "add.Tensor")):
                if node.meta["val"].dtype != torch.int64:  # int64 position arithmetic is fine
                    outside_arith.append(name)
            if "sub.Tensor" not in name:
                continue
            users = [u for u in node.users if "mul.Tensor" in str(u.target)]
            for mul in users:
                if any("add.Tensor" in str(a.target) for a in mul.users):
                    found.append(delegated)
    return found, outside_arith


@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_edge_graph_has_shear_and_xnnpack_delegates_it(tmp_path, target):
    from psa_edge.model.checkpoint import save_checkpoint

    checkpoint = tmp_path / "one-layer.pt"  # one layer: lowering time grows with the graph
    save_checkpoint(checkpoint, make_model("symmetric"), {})
    found, outside = edge_shears(checkpoint, "symmetric", target)
    assert len(found) == 2  # query and key
    if target == "xnnpack":
        assert all(found), "a shear op was left outside the XNNPACK delegate"
        assert outside == [], f"float arithmetic outside the delegate: {outside}"


def test_delegation_report_explains_every_op_outside(artifacts):
    d = manifest_of(artifacts["xnnpack"])["delegation"]
    assert d["delegated_subgraphs"] >= 1 and 0 < d["delegated_fraction"] < 1
    for report in (d, d["methods"]["decode"]):
        assert all(entry["why"] for entry in report["ops_outside_delegate"].values())
        # `add` and `mul` (exactly) are SymInt shape arithmetic; every other op is checked.
        for op in set(report["ops_outside_delegate"]) - {"add", "mul"}:
            assert not any(k in op for k in ("linear", "bmm", "softmax", "sub", "mul"))
    # The runner form: attention is ExecuTorch's llama kernels (outside the delegate, named),
    # the only float arithmetic outside; its int64 position arithmetic is `sub` and `add`.
    # Its edge graph holds update_cache functionalized; the program holds the in-place kernel
    # and no copy of a buffer.
    runner = manifest_of(artifacts["runner"])["delegation"]["ops_outside_delegate"]
    assert all(entry["why"] for entry in runner.values()), runner
    assert {"auto_functionalized_v2", "llama_custom_sdpa_default"} <= set(runner)
    assert not any(k in op for op in runner for k in ("linear", "bmm", "softmax", "mul_tensor"))
    from psa_edge.export.inspect import inspect_artifact

    ops = inspect_artifact(artifacts["runner"])["ops"]
    assert ops["llama::update_cache.out"] == 4 and ops["llama::custom_sdpa.out"] == 2  # 2 layers
    assert not any("copy_" in op or op.startswith("aten::index_put.") for op in ops), ops


@pytest.mark.parametrize("name", ["xnnpack", "portable"])
def test_attention_operands_reach_bmm_uncopied(artifacts, name):
    """No copy of a layer's cache per step in any method of the (GQA) program: no expand_copy
    (aten.matmul's broadcast), no index_select (each query head's KV head gathered)."""
    from psa_edge.export.inspect import inspect_artifact

    copies = ("expand", "index_select")
    assert not any(c in op for op in inspect_artifact(artifacts[name])["ops"] for c in copies)
    d = manifest_of(artifacts["xnnpack"])["delegation"]
    for report in (d, *d["methods"].values()):
        assert not any(c in op for op in report["ops_outside_delegate"] for c in copies)
    assert manifest_of(artifacts["portable"])["delegation"] is None


def test_decode_method_puts_the_whole_shear_in_xnnpack(artifacts):
    """At S = 1 (method `decode`) the shear's shift and slot are static: the PSA program
    leaves exactly what its twin leaves outside XNNPACK, in as many delegate calls."""
    psa, twin = (manifest_of(artifacts[n])["delegation"]["methods"]["decode"]
                 for n in ("xnnpack", "xnnpack-twin"))
    # getitem is FX tuple plumbing, not an instruction: PSA's delegates return more outputs.
    executed = lambda d: {op: e["count"] for op, e in d["ops_outside_delegate"].items()  # noqa
                          if op != "getitem"}
    assert executed(psa) == executed(twin)
    assert psa["delegated_subgraphs"] == twin["delegated_subgraphs"]
    assert not any("slice" in op for op in psa["ops_outside_delegate"])


@pytest.mark.parametrize("psa,twin", [("onnx", "onnx-twin"), ("xnnpack", "xnnpack-twin")])
def test_cache_tensors_match_twin(artifacts, psa, twin):
    tokens = np.arange(10) % 64
    sessions = [open_session(artifacts[name]) for name in (psa, twin)]
    for session in sessions:
        feed_chunks(session, tokens, [4, 6])
    s_psa, s_twin = (session.state for session in sessions)
    for layer in range(2):
        for f in ("key", "value"):
            a, b = s_psa[f"{layer}.{f}"], s_twin[f"{layer}.{f}"]
            assert a.shape == b.shape and a.dtype == b.dtype
    assert set(s_psa) - set(s_twin) == {"0.prev_key", "1.prev_key", "0.prev_query",
                                        "1.prev_query"}


@pytest.mark.parametrize("name", ["onnx", "xnnpack", "portable", "runner"])
def test_inspect(artifacts, name):
    result = cli("inspect", artifacts[name], "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["manifest"]["target"] == CASES[name][1]
    assert info["io"][0]["name"] in ("input_ids", "tokens") and info["ops"]
    if name == "xnnpack":
        assert any(op.startswith("delegate:Xnnpack") for op in info["ops"])
        assert info["delegation"]["delegated_subgraphs"] >= 1
    if name == "onnx":
        assert info["ops"]["Sub"] >= 4


@pytest.mark.parametrize("name", ["model.onnx", "model.onnx.data"])
def test_inspect_refuses_mismatched_manifest(artifacts, tmp_path, name):
    """The graph and its external weights are both checked against the manifest."""
    copy = copy_artifact(artifacts["onnx"], tmp_path / "x")
    with open(copy / name, "ab") as f:
        f.write(b"tampered")
    result = cli("inspect", copy)
    assert result.returncode == 2 and f"does not match {copy / name}" in result.stderr
    with pytest.raises(ArtifactError, match="does not match"):
        open_session(copy)


def test_a_fifo_in_place_of_the_weights_is_refused_not_read(artifacts, tmp_path):
    """A FIFO where model.onnx.data belongs would block the hash forever: refused by kind."""
    copy = copy_artifact(artifacts["onnx"], tmp_path / "x")
    (copy / "model.onnx.data").unlink()
    os.mkfifo(copy / "model.onnx.data")
    with pytest.raises(ArtifactError, match="model.onnx.data is not a regular file"):
        open_session(copy)


def test_onnx_weights_are_external_data_beside_the_graph(artifacts):
    """Every weight tensor lives in model.onnx.data (listed and hashed in the manifest), so the
    graph file holds no weights and ONNX Runtime maps them."""
    folder = artifacts["onnx"]
    graph = onnx.load(folder / "model.onnx", load_external_data=False).graph
    external = [t for t in graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {e.value for t in external for e in t.external_data if e.key == "location"} == {
        "model.onnx.data"}
    assert all(len(t.raw_data) <= 1024 for t in graph.initializer if t not in external)
    manifest = manifest_of(folder)
    assert manifest["files"]["model.onnx.data"] == sha256_file(folder / "model.onnx.data")
    assert manifest["size_bytes"] == sum((folder / n).stat().st_size
                                         for n in ("model.onnx", "model.onnx.data"))


@pytest.mark.parametrize("field", ["size_bytes", "gamma_k"])
def test_bench_refuses_a_manifest_without_a_field_it_reports(artifacts, tmp_path, field):
    """Found by the fuzz campaign: a manifest without size_bytes reached bench's report."""
    copy = copy_artifact(artifacts["onnx"], tmp_path / "x")
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest[field]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = cli("bench", copy, "-p", "4", "-n", "4", "-r", "1")
    assert result.returncode == 2 and field in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_cli_checks_names_against_the_pipelines_own():
    """The CLI refuses a misspelt target, form or scheme from the torch-free contract's tables;
    they must be exactly what the pipeline builds."""
    from psa_edge import contract
    from psa_edge.export import pipeline

    assert list(contract.BACKENDS) == list(pipeline.TARGETS)
    for form in contract.FORMS.values():  # every form's targets and schemes exist
        assert set(form.targets) <= set(pipeline.TARGETS) and set(form.schemes) <= set(
            contract.SCHEMES), form.name
    assert {scheme for t in pipeline.TARGETS.values() for scheme in t.schemes} \
        == set(contract.SCHEMES)


@pytest.mark.parametrize("args,message", [
    (["--target", "tflite"], "unknown target"),
    (["--max-seq-len", "8"], "below the parity probe length"),
    (["--target", "onnx", "--form", "runner"], "runner form"),
    (["--target", "xnnpack", "--form", "fused"], "use --target onnx"),
    (["--target", "onnx", "--form", "fused", "--quantize", "int8"], "the fused form takes"),
    (["--target", "xnnpack", "--quantize", "int8-block"], "use --target onnx"),
])
def test_export_bad_input(checkpoints, tmp_path, args, message):
    out = tmp_path / "out"
    result = cli("export", checkpoints["key-only"], "-o", out, *args)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path) == []


def test_export_unreadable_checkpoint_and_unwritable_output(checkpoints, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    result = cli("export", bad, "-o", tmp_path / "a")
    assert result.returncode == 2 and "not a readable" in result.stderr
    result = cli("export", checkpoints["key-only"], "-o", tmp_path / "no" / "a")
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.pt"]


def test_failed_parity_leaves_nothing(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "FP32_RTOL", 0.0)  # fp32 rounding alone now fails the probe
    out, stages = tmp_path / "m", []
    with pytest.raises(ExportError, match="parity check failed"):
        run_export(ExportRequest(checkpoints["symmetric"], "onnx", out, MAX_LEN), stages.append)
    assert os.listdir(tmp_path) == []
    assert stages == list(STAGES)  # each stage began in order (the CLI's bar); save's check failed


def test_onnx_runtime_path_works_without_torch(artifacts):
    """The device path runs with torch made unimportable: sessions (rollback, snapshots),
    generation, speculative decoding and the `psa-edge generate` command on an .onnx."""
    script = f"""
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, NoTorch())
import numpy as np
from psa_edge.runtime.generate import Sampling, generate
from psa_edge.runtime.session import open_session
from psa_edge.runtime.speculative import PromptLookupDrafter, speculative_generate
art = {str(artifacts['onnx'])!r}
s = open_session(art)
assert s.feed(np.arange(12) % 64).shape == (12, 64)
s.reset()
s.feed(np.arange(10) % 64); snap = s.snapshot(); s.feed([1, 2, 3]); s.rollback(11); s.restore(snap)
plain = generate(s, [1, 2, 3, 1, 2], 8)
spec = speculative_generate(s, PromptLookupDrafter(), [1, 2, 3, 1, 2], 8)
assert spec.tokens == plain.tokens
generate(s, [1, 2], 5, Sampling(temperature=0.9, top_k=5, seed=3))
from psa_edge.cli import main
sys.argv = ["psa-edge", "generate", art, "--prompt", "ABCAB", "-n", "4", "--prompt-lookup"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
assert "torch" not in sys.modules
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), \
        result.stdout + result.stderr[-1500:]
