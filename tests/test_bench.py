"""`psa-edge bench` and `psa-edge bundle` (docs/reference/spec.md §7): every reported field, the
--vs contract, the runner form with ExecuTorch's own runner (through the lab, `lab.bench`), FLOPs
against an independent count, and the bundle running torch-free from its own copy of the
runtime."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import MAX_LEN, REPO, assert_umask_modes, cli, copy_artifact, make_model
from psa_edge.display import bench_plot, bench_tables
from psa_edge.errors import ArtifactError, OutputError, SequenceError
from psa_edge.lab.bench import flops_per_token, run_bench
from psa_edge.runtime.bench import BenchSpec, Runner, decode_in_turns, geomean_ci, prepare_bench
from psa_edge.runtime.bundle import write_bundle

SMALL = BenchSpec(prompt=8, gen=8, reps=1)


def test_bench_json_has_every_field(artifacts, tmp_path):
    from psa_edge.runtime.bench import peak_rss_bytes

    ballast = np.ones(400_000_000 // 8)  # this process's peak, far above a bench process's
    plot = tmp_path / "bench.png"
    result = cli("bench", artifacts["onnx"], "--vs", artifacts["onnx-twin"], "-p", "8", "-n",
                 "8", "-r", "1", "--threads", "1", "--json", "--plot", plot)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["spec"] == {"prompt": 8, "gen": 8, "reps": 1, "depth": 0, "threads": 1}
    assert set(report["machine"]) >= {"cpu", "cores", "arch", "os"}
    assert report["threads"] == "1" and report["peak_rss_bytes"] > 0
    # the child's own high-water mark, not the one it inherited from this process at fork
    assert report["peak_rss_bytes"] < peak_rss_bytes() - ballast.nbytes // 2
    psa, twin = report["results"]
    assert (psa["label"], twin["label"]) == ("artifact", "twin")
    for r in (psa, twin):
        assert r["backend"] == "onnxruntime" and r["precision"] == "fp32"
        assert r["size_bytes"] == sum(os.path.getsize(f"{r['artifact']}/{name}")
                                      for name in ("model.onnx", "model.onnx.data"))
        assert "load_rss_bytes" in r and "load_huge_bytes" in r
        assert r["pp8"]["tokens_per_second"] > 0 and r["pp8"]["ttft_ms_mean"] > 0
        assert 0 < r["tg8"]["latency_ms_p50"] <= r["tg8"]["latency_ms_p90"]
        assert r["tg8"]["stddev"] == 0.0  # one repetition
        assert r["flops_per_token"]["total"] > 0
    assert psa["flops_per_token"]["shear"] > 0 == twin["flops_per_token"]["shear"]
    assert_umask_modes(plot)
    ratios = report["ratio_psa_over_twin"]
    assert set(ratios) == {"pp8_time", "tg8_time", "tg8_latency_p50"}
    for value in ratios.values():
        assert value["min"] <= value["median"] <= value["max"]
        assert value["min"] * (1 - 1e-12) <= value["geomean"] <= value["max"] * (1 + 1e-12)
        assert value["ci95"] is None  # one repetition has no interval
    assert 1 <= report["turn_tokens"] <= 8
    assert plot.stat().st_size > 1000
    assert set(report["huge_pages"]) == {"collapse", "thp", "anon_huge_bytes"}
    assert report["huge_pages"]["collapse"] is (sys.platform == "linux")
    table = cli("bench", artifacts["onnx"], "-p", "8", "-n", "8", "-r", "1", "--markdown")
    assert table.returncode == 0 and "| pp8 |" in table.stdout and "| tg8 |" in table.stdout
    assert "huge pages" in table.stdout.splitlines()[-1]


@pytest.mark.skipif(sys.platform != "linux", reason="/proc says which pages memory is on")
def test_report_says_which_pages_the_weights_ran_on(artifacts, monkeypatch):
    from psa_edge.backends import huge_pages

    monkeypatch.setenv("PSA_EDGE_HUGE_PAGES", "0")
    report = run_bench(artifacts["onnx"], SMALL)
    state = report["huge_pages"]
    assert state["collapse"] is False and state["thp"] == huge_pages.thp_setting()
    assert state["thp"] in ("always", "madvise", "never")
    assert isinstance(state["anon_huge_bytes"], int) and state["anon_huge_bytes"] >= 0
    if state["thp"] != "always":  # nothing asks for huge pages: the load puts none there
        assert report["results"][0]["load_huge_bytes"] == 0


def test_vs_opens_both_artifacts_afresh_every_repetition(artifacts, monkeypatch):
    opened = []
    original = Runner.open
    monkeypatch.setattr(Runner, "open", lambda self: (opened.append(self.artifact.name),
                                                      original(self))[1])
    report = run_bench(artifacts["onnx"], BenchSpec(prompt=8, gen=8, reps=3, threads=1),
                       artifacts["onnx-twin"])
    assert sorted(opened) == sorted([artifacts["onnx"].name, artifacts["onnx-twin"].name] * 3)
    p50 = report["ratio_psa_over_twin"]["tg8_latency_p50"]
    assert len(p50["per_rep"]) == 3
    low, high = p50["ci95"]
    assert low < p50["geomean"] < high


def test_vs_stops_onnx_runtime_pools_spinning_between_calls(artifacts):
    # Two ONNX Runtime sessions taking turns each spun its idle workers on the core the other
    # needed (`bench --vs` at 2 threads decoded under half speed): with `vs` each session's pool
    # stops spinning when a call returns; alone, it spins on for the next call.
    def spinning_stops(runner) -> str:
        program = getattr(runner.session, "program", None) or runner.session.graph
        return program.session.get_session_options().get_session_config_entry(
            "session.force_spinning_stop")

    for psa, twin in (("onnx", "onnx-twin"), ("fused", "fused-twin")):
        spec = BenchSpec(prompt=4, gen=4, reps=1, threads=2)
        assert [spinning_stops(r) for r in prepare_bench(artifacts[psa], spec,
                                                        artifacts[twin]).runners] == ["1", "1"]
        alone = prepare_bench(artifacts[psa], spec).runners[0]
        with pytest.raises(RuntimeError, match="does not have configuration"):  # the default
            spinning_stops(alone)


def test_plot_gives_each_label_its_own_row(tmp_path):
    # Two presets share backend and precision: unlabelled, the second one's bars replaced the
    # first's in one row; with labels each preset has its row of panels (3.8 inches at 100 dpi).
    import struct

    def report(rate: float) -> dict:
        result = {"target": "onnx", "precision": "fp32", "label": "artifact",
                  **{t: {"tokens_per_second": rate, "stddev": 1.0} for t in ("pp4", "tg4")}}
        return {"spec": {"prompt": 4, "gen": 4}, "results": [result]}

    def size(path) -> tuple[int, int]:  # a PNG's IHDR: width and height, big-endian
        return struct.unpack(">II", path.read_bytes()[16:24])

    reports = [report(100.0), report(10.0)]
    bench_plot(reports, tmp_path / "one.png")
    bench_plot(reports, tmp_path / "rows.png", ["psa-4m", "psa-30m"])
    assert size(tmp_path / "one.png") == (1000, 380)
    assert size(tmp_path / "rows.png") == (1000, 760)


def test_geomean_interval_against_hand_values_and_coverage():
    # logs 0 and 0.2: mean 0.1, sd 0.2 / sqrt(2), t(0.975, 1) = 12.706.
    summary = geomean_ci([1.0, math.exp(0.2)])
    half = 12.706 * (0.2 / math.sqrt(2)) / math.sqrt(2)
    assert summary["geomean"] == pytest.approx(math.exp(0.1))
    assert summary["ci95"] == pytest.approx([math.exp(0.1 - half), math.exp(0.1 + half)])
    # Coverage: for lognormal ratios around 1.05 the interval holds 1.05 about 95% of the time.
    rng = np.random.default_rng(0)
    for n in (3, 8, 40):
        hits = 0
        for _ in range(2000):
            low, high = geomean_ci(list(1.05 * np.exp(rng.normal(0, 0.07, n))))["ci95"]
            hits += low <= 1.05 <= high
        assert 0.93 <= hits / 2000 <= 0.97, (n, hits)


def test_decode_in_turns_alternates_and_keeps_positions():
    class Fake:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def start(self, context):
            self.log.append((self.name, "start", context.size))

        def steps(self, tokens, position, first, stop):
            stop = min(stop, tokens.size)
            self.log.append((self.name, position + first, position + stop))
            return [0.0] * (stop - first)

    log = []
    runners = [Fake("a", log), Fake("b", log)]
    times = decode_in_turns(runners, [0, 1], np.zeros(2, int), np.arange(5), 2)
    assert [len(t) for t in times] == [5, 5]
    assert log == [("a", "start", 2), ("b", "start", 2), ("a", 2, 4), ("b", 2, 4),
                   ("b", 4, 6), ("a", 4, 6), ("a", 6, 7), ("b", 6, 7)]


def test_bench_executorch_and_its_own_runner(artifacts, capsys, monkeypatch):
    from psa_edge.lab.bench import huge_pages

    report = run_bench(artifacts["xnnpack"], SMALL, artifacts["xnnpack-twin"])
    assert [r["backend"] for r in report["results"]] == ["executorch"] * 2
    collapsed, collapse = [], huge_pages.collapse_resident_memory
    monkeypatch.setattr(huge_pages, "collapse_resident_memory",
                        lambda already: collapsed.append(already) or collapse(already))
    runner = run_bench(artifacts["runner"], BenchSpec(prompt=8, gen=8, reps=2),
                       artifacts["runner-twin"])
    # TextLLMRunner's load, once per repetition, collapsed as psa-edge's own loads are.
    assert len(collapsed) == 2 and all(isinstance(a, frozenset) for a in collapsed)
    for result in runner["results"]:
        assert result["form"] == "runner" and result["tg8"]
        stats = result["executorch_runner"]
        # The runner counts generated tokens without the first one, which the prefill produces.
        assert len(stats["runs"]) == 2 and all(r["generated_tokens"] == 7 for r in stats["runs"])
        assert stats["prefill_tokens_per_second"] > 0 and stats["decode_tokens_per_second"] > 0
    # ExecuTorch's runner's own PSA / twin ratios, run by run, from the times it reported.
    runs = [r["executorch_runner"]["runs"] for r in runner["results"]]
    ratios = runner["ratio_psa_over_twin"]
    assert ratios["executorch_runner_prefill_time"]["per_rep"] == pytest.approx(
        [a["prefill_ms"] / b["prefill_ms"] for a, b in zip(*runs)])
    assert ratios["executorch_runner_decode_time_per_token"]["per_rep"] == pytest.approx(
        [a["decode_ms"] / b["decode_ms"] for a, b in zip(*runs)])  # both generate 7 tokens
    bench_tables(runner, markdown=True)
    shown = capsys.readouterr().out
    assert "| executorch runner decode time per token |" in shown
    assert "the first one opened also carries the runtime's one-time start" in shown
    for name in ("runner", "runner-twin"):
        assert f"ExecuTorch TextLLMRunner on {name} (its own Stats)" in shown
    alone = run_bench(artifacts["runner"], BenchSpec(prompt=8, gen=8, reps=1))
    assert "ratio_psa_over_twin" not in alone and alone["results"][0]["executorch_runner"]


@pytest.fixture(scope="session")
def other_config(tmp_path_factory):
    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.model.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("other")
    save_checkpoint(root / "one-layer.pt", make_model("baseline"), {})
    run_export(ExportRequest(root / "one-layer.pt", "onnx", root / "one-layer", MAX_LEN))
    return root / "one-layer"


def test_vs_refuses_what_is_not_the_twin(artifacts, other_config):
    with pytest.raises(ArtifactError, match="another config"):
        run_bench(artifacts["onnx"], SMALL, other_config)
    with pytest.raises(ArtifactError, match="target"):
        run_bench(artifacts["onnx"], SMALL, artifacts["xnnpack-twin"])
    with pytest.raises(SequenceError, match="max length"):
        run_bench(artifacts["onnx"], BenchSpec(prompt=40, gen=8, reps=1, depth=16))
    result = cli("bench", artifacts["onnx"], "--vs", other_config)
    assert result.returncode == 2 and "another config" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_flops_per_token_matches_an_independent_count(gqa_models):
    """The closed form against torch's FlopCounterMode on one decoded token (it counts the
    matmuls; the shear is elementwise and is added separately, 3 d per sheared stream)."""
    from torch.utils.flop_counter import FlopCounterMode

    for variant, model in gqa_models.items():
        context = 10
        ids = torch.zeros(1, context, dtype=torch.long)
        with torch.no_grad():
            _, state, _ = model.forward_with_state(ids, model.empty_state(1))
            with FlopCounterMode(display=False) as counter:
                model.forward_with_state(torch.zeros(1, 1, dtype=torch.long), state)
        cfg = model.cfg.to_dict()
        counted = flops_per_token(cfg, context + 1)
        assert counted["total"] - counted["shear"] == counter.get_total_flops(), variant
        widths = {"baseline": 0, "key-only": 2 * 16, "symmetric": 6 * 16, "query-only": 4 * 16}
        assert counted["shear"] == 2 * 3 * widths[variant]  # 2 layers


def without_editable_install(bundle_dir, argv: list[str]) -> str:
    """A script that imports psa_edge from the bundle only (the repo's editable install is
    removed from the import system) with torch blocked, then runs the CLI."""
    return f"""
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path = [p for p in sys.path if p.rstrip("/") != {str(REPO)!r} and "__editable__" not in p]
sys.path.insert(0, {str(bundle_dir)!r})
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, NoTorch())
import psa_edge
assert psa_edge.__file__.startswith({str(bundle_dir)!r}), psa_edge.__file__
sys.argv = ["psa-edge", *{argv!r}]
from psa_edge.cli import main
main()
"""


def test_bundle_runs_bench_torch_free(artifacts, tmp_path):
    out = tmp_path / "bundle"
    record = write_bundle([artifacts["onnx"], artifacts["onnx-twin"], artifacts["runner"]], out)
    files = set(record["files"])
    assert_umask_modes(out, out / "README.md", out / "models" / "onnx" / "model.onnx")
    assert {"models/onnx/model.onnx", "models/onnx/manifest.json", "models/runner/tokenizer.json",
            "psa_edge/runtime/bench.py", "psa-edge", "requirements-onnx.txt",
            "requirements-executorch.txt", "README.md"} <= files
    assert not any(f.startswith(("psa_edge/model", "psa_edge/export", "psa_edge/train"))
                   for f in files)
    requirements = (out / "requirements-onnx.txt").read_text()
    assert "onnxruntime==" in requirements and "torch" not in requirements
    readme = (out / "README.md").read_text()
    assert "Raspberry Pi" in readme and "Termux" in readme and "llama_main" in readme
    script = without_editable_install(out, ["bench", "models/onnx", "--vs", "models/onnx-twin",
                                            "-p", "8", "-n", "8", "-r", "1", "--json"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=out, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["ratio_psa_over_twin"]["tg8_time"]["median"] > 0
    script = without_editable_install(out, ["verify", "models/onnx", "--json"])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=out, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["passed"] and "recorded" in report["reference"], report["reference"]
    script = without_editable_install(out, ["train", "-o", "x.pt"])
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=out, env=env, timeout=120)
    assert result.returncode == 2 and "does not have" in result.stderr
    assert not (out / "x.pt").exists()


def test_bundle_bad_input_leaves_nothing(artifacts, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    with pytest.raises(OutputError, match="not an empty folder"):
        write_bundle([artifacts["onnx"]], taken)
    tampered = copy_artifact(artifacts["onnx"], tmp_path / "t")
    with open(tampered / "model.onnx", "ab") as f:
        f.write(b"x")
    with pytest.raises(ArtifactError, match="does not match"):
        write_bundle([tampered], tmp_path / "new")
    assert sorted(os.listdir(tmp_path)) == ["t", "taken"]
