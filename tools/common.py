"""What the doc-making scripts share: paths, the machine they ran on, the CLI run as a user
runs it, and the README blocks and pages they write. Every script runs with the project's
interpreter (`.venv/bin/python tools/NAME.py`) and imports this module from its own folder;
no tool imports another, and every tool imports the package's public API only
(docs/reference/architecture.md).
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "out"
BENCH = OUT / "bench"
MAX_LEN = 512  # the benchmark builds' max length
DEFAULT_MODEL = REPO / "models" / "psa-default.pt"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    """"<cpu> (<cores> cores, <arch>), torch <version>": what a page says it ran on."""
    from importlib import metadata

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "absent"
    return f"{cpu_model()} ({os.cpu_count()} cores, {platform.machine()}), torch {torch}"


def commit() -> str:
    """The repository's HEAD, short: the commit a page's block was measured at."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()


def psa_edge(*args, check: bool = True, env: dict | None = None,
             cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`psa-edge ARGS` with this interpreter, from the repository root (or from `cwd`: another
    checkout's root runs that checkout's psa-edge)."""
    result = subprocess.run([sys.executable, "-m", "psa_edge.cli", *map(str, args)],
                            capture_output=True, text=True, cwd=cwd,
                            env={**os.environ, **(env or {})})
    if check and result.returncode:
        raise SystemExit(f"psa-edge {' '.join(map(str, args))} failed:\n{result.stderr[-2000:]}")
    return result


def measured(*args, check: bool = True) -> tuple[float, int, str]:
    """`psa-edge ARGS` in its own process: (seconds, its own peak RSS in bytes, stdout); exit
    1 (a check past its threshold) is returned, any other failure stops the tool."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.time()
        child = subprocess.Popen([sys.executable, "-m", "psa_edge.cli", *map(str, args)],
                                 stdout=out, stderr=err, text=True, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)  # this child's rusage, not all children's
        seconds = time.time() - started
        out.seek(0), err.seek(0)
        if check and os.waitstatus_to_exitcode(status) not in (0, 1):
            raise SystemExit(f"psa-edge {' '.join(map(str, args))} failed:\n{err.read()[-2000:]}")
        return seconds, usage.ru_maxrss * 1024, out.read()


def psa_edge_json(*args, **kwargs) -> dict:
    return json.loads(psa_edge(*args, "--json", **kwargs).stdout)


def snap_to_q4_grid(blocks, grid: str) -> None:
    """Blocks of 32 weights snapped, in place, to the values a 4-bit quantizer keeps. "q4_0":
    step = the block's largest-magnitude weight / -8, as ONNX Runtime's MLAS and llama.cpp's
    Q4_0 compute it, weights k * step with k in [-8, 7]. "8da4w": the same after negating each
    block whose peak is positive, so the peak is -8 steps: torchao's HQQ starts from the scale
    max |w| / 8, which is then the step, and its least-squares fit keeps it. Both lossless.
    "qc4w" (pass whole rows as blocks): 9389d90's per-row XNNPACK int4, step = max |w| / 7.5
    (PerChannelMinMaxObserver); the peak, made negative, is -7.5 steps and becomes -8 there,
    the only weight not kept."""
    import torch

    at = blocks.abs().argmax(-1, keepdim=True)
    peak = blocks.gather(-1, at)
    if grid in ("8da4w", "qc4w"):
        blocks.mul_(torch.where(peak > 0, -1.0, 1.0))
        peak = -peak.abs()
    steps = 7.5 if grid == "qc4w" else 8
    step = torch.where(peak == 0, torch.ones_like(peak), peak / -steps)
    blocks.copy_((blocks / step).round().clamp(-8, 7) * step)
    blocks.scatter_(-1, at, peak)  # the peak itself: -8 steps, or qc4w's -7.5


def random_checkpoint(preset: str, path: Path, vocab_task: bool = True,
                      q4_grid: str | None = None) -> Path:
    """A checkpoint of a preset with random weights (seed 0, key-only gamma_k 0.8): speed and
    size do not depend on what the weights learned. It records an ih-sht task of its vocabulary
    so that static int8 can calibrate. `q4_grid` ("q4_0" for ONNX Runtime and llama.cpp, "8da4w"
    for XNNPACK): every linear's weights snapped to that quantizer's 4-bit grid
    (`snap_to_q4_grid`): random psa-92m's own weights lose so much at 4 bits that the
    exporter's parity gate refuses the build."""
    import torch

    from psa_edge.model import PSATransformer, preset_config
    from psa_edge.model.checkpoint import save_checkpoint

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        model = PSATransformer(preset_config(preset, "key-only", 0.8))
        with torch.no_grad():
            for name, weight in model.named_parameters():
                if q4_grid and weight.dim() == 2 and "embed_tokens" not in name:
                    block = weight.shape[1] if q4_grid == "qc4w" else 32
                    snap_to_q4_grid(weight.view(weight.shape[0], -1, block), q4_grid)
        task = {"name": "ih-sht", "params": {"seq_len": 256,
                                             "alphabet": model.cfg.vocab_size}}
        save_checkpoint(path, model, {"task": task if vocab_task else None,
                                      "note": "random weights (seed 0)"})
    return path


OVERVIEW = "docs/results/overview.md"  # the headline blocks (the README links to it)


def page_with_block(name: str, page: str = OVERVIEW) -> tuple[str, str, str]:
    """A page's text and the markers of its block `name`; exits with one line if it has none
    (call it before a long measurement whose result goes there)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = (REPO / page).read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{page} has no {begin} ... {end} block")
    return text, begin, end


def write_block(name: str, text: str, page: str = OVERVIEW) -> None:
    """Replace the block between `<!-- name:begin -->` and `<!-- name:end -->` of a page (the
    results overview by default, the README or another page under docs/; atomically; the
    markers must be there)."""
    from psa_edge.io import write_text

    readme, begin, end = page_with_block(name, page)
    head, rest = readme.split(begin, 1)
    write_text(REPO / page, head + begin + "\n" + text.rstrip("\n") + "\n" + end
               + rest.split(end, 1)[1])


def write_doc(name: str, text: str) -> None:
    from psa_edge.io import write_text

    write_text(REPO / "docs" / "results" / name, text.rstrip("\n") + "\n")


def quant_spec(name: str):
    """A scheme's spec from its build name: "int4", or "int4-g128" for groups of 128."""
    from psa_edge.export.quantize import QuantSpec

    grouped = re.fullmatch(r"(.+)-g(\d+)", name)
    if grouped:
        return QuantSpec(grouped[1], group_size=int(grouped[2]))
    return QuantSpec(name)


def export_once(checkpoint: Path, folder: Path, target: str, quant: str | None = None,
                twin: bool = False, form: str = "explicit-state",
                max_seq_len: int | None = None) -> Path:
    """An artifact of `checkpoint` at `folder`, exported unless one is there that this psa-edge
    would write the same way (same source, graph I/O, weight and activation layouts, and files:
    a build an older psa-edge wrote can hold a side file this one no longer writes)."""
    from psa_edge.checks.verify import REFERENCE
    from psa_edge.contract import MODEL_FILES, ONNX_DATA, GraphIO
    from psa_edge.errors import PsaEdgeError
    from psa_edge.export.pipeline import TARGETS, ExportRequest, run_export
    from psa_edge.export.quantize import calibration_record
    from psa_edge.io import read_artifact, sha256_file
    from psa_edge.model.config import ModelConfig
    from psa_edge.tokenizer import FILES as TOKENIZER_FILES

    spec = quant_spec(quant) if quant else None
    layouts = ("weights", "activations")
    expected = spec and calibration_record(None, None, spec, TARGETS[target])
    try:
        m = read_artifact(folder).manifest
        GraphIO.from_manifest(m)
        same = ("self_check" in m and m["source_checkpoint"]["sha256"] == sha256_file(checkpoint)
                and m["twin"] == twin and m["form"] == form
                and (max_seq_len is None or m["max_seq_len"] == max_seq_len)
                and [(m["quantization"] or {}).get(k) for k in layouts]
                == [(expected or {}).get(k) for k in layouts])
        side = TARGETS[target].side_files(ModelConfig.from_dict(m["config"]), m["max_seq_len"],
                                          form)
        weights = {ONNX_DATA} if target == "onnx" else set()  # an older build's one file: again
        same = same and set(m["files"]) == {MODEL_FILES[target], *weights, REFERENCE,
                                            *TOKENIZER_FILES, *side} and all(
            json.loads((folder / name).read_text()) == content for name, content in side.items())
    except (PsaEdgeError, KeyError, OSError, ValueError):
        same = False
    if not same:
        run_export(ExportRequest(checkpoint, target, folder, max_seq_len, twin, form, spec))
    return folder


def bench_checkpoint(preset: str, q4_grid: str | None = None) -> Path:
    """The random checkpoint of a preset in out/bench/ (snapped to `q4_grid`, if given), which
    psa-edge's benchmark builds and llama.cpp's GGUF of the same grid share."""
    suffix = {None: "", "q4_0": "-q4grid", "8da4w": "-8da4w-grid", "qc4w": "-qc4w-grid"}[q4_grid]
    return random_checkpoint(preset, BENCH / f"{preset}{suffix}.pt", q4_grid=q4_grid)


def build_checkpoint(preset: str, target: str, quant: str | None) -> Path:
    """The random checkpoint a benchmark build of `target` and `quant` is exported from: int4
    builds (of any group size) take the one on their quantizer's 4-bit grid of 32."""
    grid = (None if not (quant or "").startswith("int4") else "8da4w" if target == "xnnpack"
            else "q4_0")
    return bench_checkpoint(preset, grid)


def artifact(preset: str, target: str, quant: str | None, twin: bool, form: str) -> Path:
    """The benchmark build of a random-weight preset (out/bench/), exported once."""
    ckpt = build_checkpoint(preset, target, quant)
    from psa_edge.contract import get_form

    suffix = get_form(form).suffix
    name = "-".join([preset, target, quant or "fp32"] + ([suffix] if suffix else [])
                    + (["twin"] if twin else []))
    return export_once(ckpt, BENCH / name, target, quant, bool(twin), form, MAX_LEN)


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"
