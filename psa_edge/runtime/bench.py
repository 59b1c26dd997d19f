"""`psa-edge bench`: prefill and decode speed of an artifact, modelled on llama.cpp's
llama-bench (docs/reference/spec.md §7). numpy + onnxruntime; ExecuTorch only for a .pte.

Contract: `run_bench(artifact, spec, vs=None)`:
- tests: `pp{p}` (prefill of p tokens in one call) and `tg{n}` (n decode calls of one token),
  each after a context of `depth` tokens (not timed), one warm-up run of each, then `reps`
  timed runs. Token ids are fixed random draws: no tokenisation, no sampling is timed;
- per test: tokens/s mean and stddev over the runs; for tg, per-token latency p50/p90 over
  every decoded token; for pp, time to first token (the prefill call) mean;
- `vs` (the gamma = 0 twin): both artifacts run interleaved in this process, A B then B A
  alternately (the decode steps in turns of about TURN_SECONDS, reported as `turn_tokens`),
  and each repetition opens both afresh (not timed) and warms them up again; ONNX Runtime's
  pools then stop spinning when a call returns (`open_session(takes_turns=True)`: each side's
  spinning workers held the core the other needed).
  Per repetition the ratios PSA/twin are taken (prefill time, decode time, median per-token
  latency) and reported with their median, range, geometric mean and its 95% confidence
  interval (Student t over the log ratios). Interleaving puts a noisy machine's drift on both
  sides; reopening makes what is fixed for an opened session (where its buffers and weights
  landed in memory), which an A/A control (an artifact against its own copy) showed to move a
  ratio by several percent, vary between repetitions, so the interval covers it. The price:
  alternating every few milliseconds, each artifact runs with the other's weights partly in
  its caches, so with `vs` the absolute rates and latencies are below what an artifact reaches
  alone (measure those without `vs`);
  `vs` must have the same config but for gamma, the same target and the same quantization;
- runner-form `.pte` (`forward(tokens, input_pos)`): psa-edge's loop drives the method;
- also reported: artifact size, backend, precision, threads, RSS added by loading the artifact
  (and warm-up; the first artifact opened also carries the process's one-time start of its
  runtime: about 37 MB for ONNX Runtime on the default model, whichever artifact is first:
  `display.LOAD_RSS_NOTE`) and the process's peak RSS, and the machine;
- and the pages the weights ran on, which moved decode speed by up to 1.18x
  (docs/reference/runtime.md):
  per artifact the bytes its load put on transparent huge pages (`load_huge_bytes`), and per
  report `huge_pages` (`backends.huge_pages.state()` after psa-edge's own runs: whether loads
  are collapsed, the kernel's THP setting, the process's bytes on huge pages then).

This is what a device runs (the bundle ships it). The measurement lab around it (FLOPs per
token, ExecuTorch's own TextLLMRunner beside psa-edge's loop, the ONNX Runtime profile) is
`psa_edge/lab/`, which the CLI adds where it is installed and the device bundle does not ship.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from psa_edge.backends import huge_pages
from psa_edge.errors import ArtifactError, SequenceError
from psa_edge.contract import same_architecture
from psa_edge.io import read_artifact
from psa_edge.runtime.session import open_session


# With --vs the two artifacts' decode steps alternate in turns of about this long. On a shared
# VM, slow spells of tens of milliseconds made the A/A ratio of 128-token turns range over
# 0.56-1.75 between repetitions; 4 ms turns put a spell on both sides, while a turn still runs
# with its own weights in cache after its first step (one-step turns measured 0.80 ms per
# psa-4m token against 0.46 ms: each step then finds the other model's weights in cache).
TURN_SECONDS = 0.004


@dataclass(frozen=True)
class BenchSpec:
    prompt: int = 128
    gen: int = 128
    reps: int = 5
    depth: int = 0
    threads: int | None = None


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("model name", "Hardware", "Model"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "arch": platform.machine(),
            "os": platform.platform(), "python": platform.python_version()}


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; elsewhere the peak as an upper bound)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process's peak resident set size: Linux's VmHWM, whose mark starts afresh at exec
    (ru_maxrss keeps the mark of the process that forked this one, which a benchmark script
    holding a large model reported as this process's); elsewhere ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


class Runner:
    """One artifact under test: prefill and decode timers over its session (either form)."""

    def __init__(self, artifact: Path, threads: int | None, takes_turns: bool = False,
                 profile_prefix: str | None = None):
        before, huge_before = rss_bytes(), huge_pages.anon_huge_bytes()
        self.artifact, self.threads, self.takes_turns = artifact, threads, takes_turns
        self.profile_prefix = profile_prefix  # ONNX Runtime's profiler writes there (--profile)
        self.open()
        self.manifest = self.session.manifest
        self.load_rss = rss_bytes() - before
        huge_after = huge_pages.anon_huge_bytes()
        self.load_huge = (None if huge_before is None or huge_after is None
                          else huge_after - huge_before)

    def open(self) -> None:
        """Open the artifact afresh; the previous session (and its program) is released first."""
        self.session = None
        self.session = open_session(self.artifact, self.threads, takes_turns=self.takes_turns,
                                    profile_prefix=self.profile_prefix)

    def warm_up(self, context: np.ndarray, prompt: np.ndarray, gen: np.ndarray) -> float:
        """One prefill and a few decode steps; returns the median seconds per decode step."""
        self.prefill(context, prompt)
        return statistics.median(self.decode(context, gen[:8]))

    def start(self, context: np.ndarray) -> None:
        self.session.reset()
        if context.size:
            self.session.feed(context, last_only=True)

    def prefill(self, context: np.ndarray, prompt: np.ndarray) -> float:
        self.start(context)
        started = time.perf_counter()
        self.session.feed(prompt, last_only=True)
        return time.perf_counter() - started

    def steps(self, tokens: np.ndarray, position: int, first: int, stop: int) -> list[float]:
        """Seconds of each decode call for `tokens[first:stop]`, `tokens[0]` at `position`."""
        times, feed = [], self.session.feed
        for i in range(first, min(stop, tokens.size)):
            started = time.perf_counter()
            feed(tokens[i:i + 1])
            times.append(time.perf_counter() - started)
        return times

    def decode(self, context: np.ndarray, tokens: np.ndarray) -> list[float]:
        self.start(context)
        return self.steps(tokens, context.size, 0, tokens.size)


def decode_in_turns(runners: list[Runner], order: list[int], context: np.ndarray,
                    tokens: np.ndarray, block: int) -> list[list[float]]:
    """Each runner decodes `tokens` after `context`, the runners taking turns every `block`
    tokens (the order reversed every other turn); per runner, the seconds of each call."""
    for runner in runners:
        runner.start(context)
    times = [[] for _ in runners]
    for turn, first in enumerate(range(0, tokens.size, block)):
        for i in order if turn % 2 == 0 else order[::-1]:
            times[i] += runners[i].steps(tokens, context.size, first, first + block)
    return times


def turn_length(seconds_per_token: float) -> int:
    """Decode steps per turn when two artifacts alternate: about TURN_SECONDS of decoding."""
    return max(1, round(TURN_SECONDS / seconds_per_token))


def set_threads(manifests: list[dict], threads: int | None) -> str:
    """Thread count per backend; ExecuTorch's threadpool is process-wide."""
    if any(m.get("backend") == "executorch" for m in manifests):
        from psa_edge.backends.executorch import set_threads as set_executorch_threads

        return str(set_executorch_threads(threads))
    return str(threads) if threads else f"onnxruntime default ({os.cpu_count()} cores)"


def check_pair(a: dict, b: dict, names: tuple[str, str]) -> None:
    if not same_architecture(a["config"], b["config"]):
        raise ArtifactError(f"--vs {names[1]} has another config than {names[0]} (beyond "
                            f"gamma); the comparison needs the gamma = 0 twin")
    # Another form of the same target is allowed: the ratio is then that of the two forms
    # (tools/raw_key_cost.py: the raw-key form against the explicit-state one, both PSA).
    if a.get("target") != b.get("target"):
        raise ArtifactError(f"--vs {names[1]} has target {b.get('target')!r}, {names[0]} "
                            f"{a.get('target')!r}")
    scheme = lambda m: (m.get("quantization") or {}).get("scheme", "fp32")  # noqa: E731
    if scheme(a) != scheme(b):
        raise ArtifactError(f"--vs {names[1]} is {scheme(b)}, {names[0]} is {scheme(a)}")


def summarize(times: list[float], tokens: int) -> dict:
    rates = [tokens / t for t in times]
    return {"tokens_per_second": statistics.mean(rates),
            "stddev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "seconds_mean": statistics.mean(times)}


# Student t quantiles t(0.975, df) for df = 1..30; beyond, the first Cornish-Fisher term
# z + (z^3 + z) / (4 df) is within 0.2% of the exact quantile.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_ci(values) -> tuple[float, float | None]:
    """Mean of values and the half width of its 95% confidence interval (Student t; None for
    a single value)."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, None
    df, z = len(values) - 1, 1.960
    t = T_975[df - 1] if df <= len(T_975) else z + (z ** 3 + z) / (4 * df)
    return mean, t * float(values.std(ddof=1)) / np.sqrt(len(values))


def geomean_ci(ratios: list[float]) -> dict:
    """Geometric mean of ratios and its 95% confidence interval (t over the logs; None for
    a single ratio)."""
    mean, half = mean_ci(np.log(ratios))
    if half is None:
        return {"geomean": float(np.exp(mean)), "ci95": None}
    return {"geomean": float(np.exp(mean)),
            "ci95": [float(np.exp(mean - half)), float(np.exp(mean + half))]}


def ratio(a: list[float], b: list[float]) -> dict:
    pairs = [x / y for x, y in zip(a, b)]
    return {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs),
            **geomean_ci(pairs), "per_rep": pairs}


@dataclass
class Bench:
    """A checked benchmark: the opened artifacts, ready to run."""
    spec: BenchSpec
    runners: list[Runner]
    manifests: list[dict]
    threads: str
    has_twin: bool


def prepare_bench(artifact: Path, spec: BenchSpec, vs: Path | None = None) -> Bench:
    """Every check of the input, then the artifacts opened (`PsaEdgeError` on bad input)."""
    artifact = Path(artifact)
    paths = [artifact] + ([Path(vs)] if vs else [])
    manifests = [read_artifact(p, check_hash=False).manifest for p in paths]
    if vs:
        check_pair(manifests[0], manifests[1], (artifact.name, Path(vs).name))
    max_len = manifests[0]["max_seq_len"]
    if spec.depth + max(spec.prompt, spec.gen) > max_len or min(spec.prompt, spec.gen,
                                                                spec.reps) < 1:
        raise SequenceError(f"depth {spec.depth} + max(p {spec.prompt}, n {spec.gen}) must fit "
                            f"the artifact's max length {max_len}, with p, n, r >= 1")
    threads = set_threads(manifests, spec.threads)
    return Bench(spec, [Runner(p, spec.threads, takes_turns=bool(vs)) for p in paths], manifests,
                 threads, bool(vs))


def run_bench(artifact: Path, spec: BenchSpec, vs: Path | None = None, progress=None) -> dict:
    return execute(prepare_bench(artifact, spec, vs), progress)


def execute(bench: Bench, progress=None) -> dict:
    spec, runners, manifests, vs = bench.spec, bench.runners, bench.manifests, bench.has_twin
    rng = np.random.default_rng(0)
    vocab = runners[0].session.io.vocab_size
    context = rng.integers(0, vocab, size=spec.depth)
    prompt, gen = rng.integers(0, vocab, size=spec.prompt), rng.integers(0, vocab, size=spec.gen)
    pp = [[] for _ in runners]
    tg = [[] for _ in runners]
    block = spec.gen
    for rep in range(spec.reps):
        order = list(range(len(runners)))[::1 if rep % 2 == 0 else -1]
        if rep == 0 or vs:
            for i in order:
                if rep:  # a fresh session per repetition (see the module docstring)
                    runners[i].open()
                step_seconds = runners[i].warm_up(context, prompt, gen)
                if rep == 0 and vs:
                    block = min(block, turn_length(step_seconds))
        for i in order:
            pp[i].append(runners[i].prefill(context, prompt))
        for i, times in enumerate(decode_in_turns(runners, order, context, gen, block)):
            tg[i].append(times)
        if progress:
            progress()
    results = []
    for i, (r, m) in enumerate(zip(runners, manifests)):
        steps = np.concatenate(tg[i])
        results.append({
            "artifact": str(r.artifact), "label": "twin" if vs and i == 1 else "artifact",
            "target": m.get("target"), "backend": m.get("backend"), "form": m.get("form"),
            "precision": (m.get("quantization") or {}).get("scheme", "fp32"),
            "variant": m.get("variant"), "gamma_k": m.get("gamma_k"),
            "gamma_q": m.get("gamma_q"), "size_bytes": m.get("size_bytes"),
            "load_rss_bytes": r.load_rss, "load_huge_bytes": r.load_huge,
            f"pp{spec.prompt}": {**summarize(pp[i], spec.prompt),
                                 "ttft_ms_mean": 1e3 * statistics.mean(pp[i])},
            f"tg{spec.gen}": {**summarize([sum(t) for t in tg[i]], spec.gen),
                              "latency_ms_p50": 1e3 * float(np.percentile(steps, 50)),
                              "latency_ms_p90": 1e3 * float(np.percentile(steps, 90))}})
    report = {"spec": dataclasses.asdict(spec), "threads": bench.threads, "machine": machine(),
              "depth": spec.depth, "results": results, "peak_rss_bytes": peak_rss_bytes(),
              "huge_pages": huge_pages.state()}
    if vs:
        report["turn_tokens"] = block
        report["ratio_psa_over_twin"] = {
            f"pp{spec.prompt}_time": ratio(pp[0], pp[1]),
            f"tg{spec.gen}_time": ratio([sum(t) for t in tg[0]], [sum(t) for t in tg[1]]),
            f"tg{spec.gen}_latency_p50": ratio([float(np.median(t)) for t in tg[0]],
                                               [float(np.median(t)) for t in tg[1]])}
    return report


def dumps(report: dict) -> str:
    return json.dumps(report, indent=2, default=float)
