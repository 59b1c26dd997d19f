"""Graph forms are registered objects (docs/reference/architecture.md): no code outside the registry
compares a form's name, and a fourth form registered here, in the test, exports, runs, verifies
and benchmarks without a line of export, runtime or bench changed."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import MAX_LEN, REPO
from psa_edge import contract
from psa_edge.errors import ArtifactError, ExportError

REGISTRY = REPO / "psa_edge" / "contract.py"


def literal_names(node) -> set[str]:
    """The string constants of a comparison operand (a constant, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(literal_names(e) for e in node.elts)) if node.elts else set()
    return set()


def form_comparisons(path: Path) -> list[int]:
    """Lines of `x == "runner"`, `form in ("fused", ...)` and the like: a form's name
    compared."""
    names = set(contract.FORMS)
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Compare)
            and any(literal_names(o) & names for o in [node.left, *node.comparators])]


def test_no_form_name_is_compared_outside_the_registry():
    sources = [p for p in sorted((REPO / "psa_edge").rglob("*.py")) if p != REGISTRY]
    sources += sorted((REPO / "tools").glob("*.py"))
    found = [f"{path.relative_to(REPO)}:{line}" for path in sources
             for line in form_comparisons(path)]
    assert not found, f"compare a form's name through contract.get_form instead: {found}"


def test_the_grep_finds_a_comparison(tmp_path):
    """The check above can fail: it sees each way a name can be compared."""
    source = tmp_path / "x.py"
    source.write_text('a = m.get("form") == "runner"\nb = f in ("x", "fused")\n'
                      'c = "explicit-state" != f\nd = f == "other"\n')
    assert sorted(form_comparisons(source)) == [1, 2, 3]


def test_an_unknown_form_is_refused_by_name():
    with pytest.raises(ArtifactError, match="unknown graph form 'toy'.*explicit-state"):
        contract.get_form("toy")
    with pytest.raises(Exception, match="new name"):
        contract.register_form(type("Again", (contract.GraphForm,), {"name": "runner"}))


class ToyForm(contract.ExplicitStateForm):
    """The explicit-state graph under other tensor names, built for ONNX only, without
    onnxruntime-genai's config: what a fourth form has to say, and nothing else."""
    name = "toy"
    targets = ("onnx",)
    schemes = ("int8-dynamic",)
    past_name = "cache_in.{layer}.{field}"
    present_name = "cache_out.{layer}.{field}"
    raw_name = "raw_out.{stream}"
    suffix = "toy"

    def onnx_clients(self, io):
        return ()


@pytest.fixture
def toy_form():
    contract.register_form(ToyForm)
    yield contract.FORMS["toy"]
    del contract.FORMS["toy"]


def test_a_fourth_form_exports_runs_verifies_and_benches(toy_form, checkpoints, artifacts,
                                                         tmp_path):
    import onnx

    from psa_edge.checks.verify import verify
    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.lab.bench import run_bench
    from psa_edge.runtime.bench import BenchSpec
    from psa_edge.runtime.generate import generate
    from psa_edge.runtime.session import open_session

    with pytest.raises(ExportError, match="not built for --target xnnpack; use --target onnx"):
        run_export(ExportRequest(checkpoints["symmetric"], "xnnpack", tmp_path / "x", MAX_LEN,
                                 form="toy"))
    with pytest.raises(ExportError, match="takes --quantize int8-dynamic, not int4"):
        from psa_edge.export.quantize import QuantSpec

        run_export(ExportRequest(checkpoints["symmetric"], "onnx", tmp_path / "x", MAX_LEN,
                                 form="toy", quant=QuantSpec("int4")))
    manifest = run_export(ExportRequest(checkpoints["symmetric"], "onnx", tmp_path / "toy",
                                        MAX_LEN, form="toy"))
    assert manifest["form"] == "toy" and manifest["parity"]["passed"]
    assert not (tmp_path / "toy" / "genai_config.json").exists()
    graph = onnx.load(tmp_path / "toy" / "model.onnx")
    inputs = [i.name for i in graph.graph.input]
    assert inputs[0] == "input_ids" and inputs[1] == "cache_in.0.key"
    assert "raw_out.raw_key" in [o.name for o in graph.graph.output]
    assert json.loads((tmp_path / "toy" / "manifest.json").read_text())["io"]["inputs"] == inputs

    prompt = np.arange(5) % 64
    toy = generate(open_session(tmp_path / "toy"), prompt, 16).tokens
    same = generate(open_session(artifacts["onnx"]), prompt, 16).tokens
    assert toy == same  # the same graph under other names decodes the same tokens
    report = verify(tmp_path / "toy", checkpoints["symmetric"])
    assert report["form"] == "toy" and all(c["passed"] for c in report["checks"])
    bench = run_bench(tmp_path / "toy", BenchSpec(prompt=8, gen=8, reps=1))
    assert bench["results"][0]["form"] == "toy" and bench["results"][0]["tg8"]
