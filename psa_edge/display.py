"""Terminal presentation of the commands: progress bars and tables (rich only, no torch).

Contract: `progress_bar(label, total, enabled)` is a context manager yielding `advance()`;
with `enabled=False` (e.g. under `--json`) it draws nothing and `advance` does nothing;
`stage_bar` is the same over named stages, on a terminal only. The other functions print one
command's report (export summary, inspect, quant-check, verify, bench) from the plain dict the
library returned.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from rich.table import Table


def make_console(stderr: bool = False):
    """A rich console; when the output is not a terminal (CI logs, pipes) tables get 160
    columns instead of rich's default 80, so they do not wrap into unreadable cells."""
    from rich.console import Console

    console = Console(soft_wrap=True, stderr=stderr)
    return console if console.is_terminal else Console(soft_wrap=True, stderr=stderr, width=160)


@contextlib.contextmanager
def progress_bar(label: str, total: int, enabled: bool = True):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeRemainingColumn

    with Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True),
                  disable=not enabled) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n=1: bar.advance(task, n)


@contextlib.contextmanager
def stage_bar(label: str, stages: tuple[str, ...], enabled: bool = True):
    """A bar over named stages, yielding `started(stage)`: the bar names the stage now running
    and counts those done. Drawn from the first `started` on, on a terminal only, and erased
    when the work ends, so what stays is the command's result or its one-line error."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True,
                   disable=not (enabled and console.is_terminal))
    task = None

    def started(stage: str) -> None:
        nonlocal task
        if task is None:
            task = bar.add_task(label, total=len(stages))
        bar.update(task, completed=stages.index(stage), description=f"{label}: {stage}")
        bar.start()  # once: a started bar ignores it

    try:
        yield started
    finally:
        bar.stop()


def verify_table(report: dict) -> None:
    console = make_console()
    reference = report["reference"]
    if os.path.exists(reference):
        reference = os.path.relpath(reference)
    checks = Table("check", "what", "measured", "tolerance", "result",
                   title=f"verify {report['artifact']} ({report['backend']}, {report['form']}, "
                         f"{report['quantization']}) against {reference}")
    for c in report["checks"]:
        what = c["detail"] + (f" [{c['note']}]" if c["note"] else "")
        checks.add_row(c["name"], what, f"{c['error']:.2e}", f"{c['tolerance']:.2e}",
                       "[green]PASS[/]" if c["passed"] else "[red]FAIL[/]")
    console.print(checks)
    cache = Table("length", "twin KV cache (bytes)", "PSA KV cache (bytes)",
                  "PSA extra state (bytes)", "ratio", title=f"KV-cache size ({report['twin']})")
    for row in report["cache"]:
        cache.add_row(str(row["length"]), f"{row['twin_cache_bytes']:,}",
                      f"{row['psa_cache_bytes']:,}", f"{row['extra_bytes']:,}",
                      f"{row['ratio']:.3f}")
    console.print(cache)
    console.print("PASS: every check" if report["passed"] else "FAIL: see the table")


def bench_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    spec = report["spec"]
    pp, tg = f"pp{spec['prompt']}", f"tg{spec['gen']}"
    at = f" @ d{report['depth']}" if report["depth"] else ""
    header = ["model", "backend", "precision", "size (MB)", "threads", "test", "t/s",
              "p50 ms", "p90 ms", "TTFT ms", "load RSS (MB)"]
    rows = []
    for r in report["results"]:
        model = f"{r['variant']} (gk {r['gamma_k']:g}, gq {r['gamma_q']:g})"
        common = [model, f"{r['target']} {r['form']}", r["precision"],
                  f"{(r['size_bytes'] or 0) / 1e6:.2f}", report["threads"]]
        p, t = r[pp], r[tg]
        rows.append(common + [pp + at, f"{p['tokens_per_second']:.1f} ± {p['stddev']:.1f}", "",
                              "", f"{p['ttft_ms_mean']:.2f}", f"{r['load_rss_bytes'] / 1e6:.1f}"])
        rows.append(common + [tg + at, f"{t['tokens_per_second']:.1f} ± {t['stddev']:.1f}",
                              f"{t['latency_ms_p50']:.3f}", f"{t['latency_ms_p90']:.3f}", "",
                              f"{r['load_rss_bytes'] / 1e6:.1f}"])
    return header, rows


# Measured on the shipped default model, ONNX: `bench PSA --vs TWIN` showed 42.7 / 5.5 MB and
# `bench TWIN --vs PSA` 42.6 / 6.2 MB. The first open pays the process's one-time start,
# whichever artifact it opens: importing ONNX Runtime (about 20 MB), its first session (about
# 17 MB beyond a second one's) and the tokenizer library's start (about 5 MB).
LOAD_RSS_NOTE = ("load RSS: what opening each artifact added to this process; the first one "
                 "opened also carries the runtime's one-time start (its import, its first "
                 "session, the tokenizer library), which overstates that artifact's own memory")


RATIO_HEADER = ["PSA / twin ratio", "geomean [95% CI]", "median", "range over reps"]


def ratio_rows(report: dict) -> list[list[str]]:
    rows = []
    for name, value in report.get("ratio_psa_over_twin", {}).items():
        ci = value["ci95"]
        interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        rows.append([name.replace("_", " "), f"{value['geomean']:.3f}{interval}",
                     f"{value['median']:.3f}", f"[{value['min']:.3f}, {value['max']:.3f}]"])
    return rows


def runner_lines(report: dict) -> list[str]:
    """One line per runner-form result: ExecuTorch's TextLLMRunner on that file."""
    lines = []
    for result in report["results"]:
        stats = result.get("executorch_runner")
        if stats:
            lines.append(f"ExecuTorch TextLLMRunner on {Path(result['artifact']).name} (its own "
                         f"Stats): prefill {stats['prefill_tokens_per_second']:.1f} ± "
                         f"{stats['prefill_stddev']:.1f} t/s, decode "
                         f"{stats['decode_tokens_per_second']:.1f} ± "
                         f"{stats['decode_stddev']:.1f} t/s")
    return lines


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def huge_pages_line(report: dict) -> str:
    """Which pages the weights ran on: decode speed depends on it (docs/reference/runtime.md)."""
    state = report.get("huge_pages") or {}
    if state.get("anon_huge_bytes") is None:
        return "huge pages unknown"
    collapsed = "loads collapsed" if state["collapse"] else "loads not collapsed"
    return (f"on huge pages {state['anon_huge_bytes'] / 1e6:.0f} MB (THP "
            f"{state['thp'] or 'unknown'}, {collapsed})")


def bench_tables(report: dict, markdown: bool = False) -> None:
    header, rows = bench_rows(report)
    m = report["machine"]
    machine = (f"{m['cpu']}, {m['cores']} cores, {m['arch']}, {m['os']}; peak RSS "
               f"{report['peak_rss_bytes'] / 1e6:.0f} MB; {huge_pages_line(report)}")
    ratios = ratio_rows(report)
    runner = runner_lines(report)
    if markdown:
        print(markdown_table(header, rows))
        if ratios:
            print()
            print(markdown_table(RATIO_HEADER, ratios))
        for line in runner + [LOAD_RSS_NOTE]:
            print(f"\n{line}")
        print(f"\n{machine}")
        return
    console = make_console()
    table = Table(*header, title="psa-edge bench")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if ratios:
        ratio_table = Table(*RATIO_HEADER, title="overhead of the shear (interleaved, a fresh "
                                                 "session per repetition; 1.00 = none)")
        for row in ratios:
            ratio_table.add_row(*row)
        console.print(ratio_table)
    for line in runner + [LOAD_RSS_NOTE]:
        console.print(line)
    console.print(machine)


def profile_table(report: dict) -> None:
    """`bench --profile`: microseconds per prefill and per decoded token, per operator type,
    and outside ONNX Runtime's run."""
    console = make_console()
    prefill = report["prefill"]
    for item, unit, times, title in (
            ("prefill", "us / prefill", prefill,
             f"a {prefill['tokens']}-token prefill, mean of {prefill['repetitions']}"),
            ("token", "us / token", report,
             f"{report['decode_tokens']} tokens after {report['context']}")):
        table = Table("operator", unit, "share of the ORT run",
                      title=f"psa-edge bench --profile: {report['artifact']} ({report['form']}, "
                            f"{report['precision']}), {title}")
        run = times[f"ort_run_us_per_{item}"]
        for op, us in times[f"kernel_us_per_{item}"].items():
            table.add_row(op, f"{us:.1f}", f"{100 * us / run:.1f}%")
        console.print(table)
        console.print(f"per {item}: feed {times[f'wall_us_per_{item}']:.0f} us = ONNX Runtime "
                      f"run {run:.0f} us + outside it {times[f'outside_ort_us_per_{item}']:.0f} "
                      f"us; {times[f'nodes_per_{item}']:.0f} nodes (kernel times include the "
                      f"profiler's own cost)")


def bench_plot(reports: list[dict], path, labels: list[str] | None = None) -> None:
    """Grouped bars: tokens/s of each test per backend and precision, PSA beside its twin. With
    `labels` (one per report, such as its preset), one row of panels per distinct label, each
    on its own scale; without, one row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from psa_edge.io import atomic_output

    labels = labels or [""] * len(reports)
    rows = list(dict.fromkeys(labels))
    groups, values = {row: [] for row in rows}, {}
    for report, row in zip(reports, labels):
        spec = report["spec"]
        for r in report["results"]:
            group = f"{r['target']} {r['precision']}"
            if group not in groups[row]:
                groups[row].append(group)
            side = "twin (gamma 0)" if r["label"] == "twin" else "PSA"
            for test in (f"pp{spec['prompt']}", f"tg{spec['gen']}"):
                values[(row, test, side, group)] = (r[test]["tokens_per_second"],
                                                    r[test]["stddev"])
    tests = sorted({k[1] for k in values}, key=lambda t: (t[:2] != "pp", t))
    fig, axes = plt.subplots(len(rows), len(tests), figsize=(5 * len(tests), 3.8 * len(rows)),
                             squeeze=False)
    for row, row_axes in zip(rows, axes):
        for ax, test in zip(row_axes, tests):
            for j, side in enumerate(("PSA", "twin (gamma 0)")):
                xs = [i + (j - 0.5) * 0.38 for i in range(len(groups[row]))]
                ys = [values.get((row, test, side, g), (0, 0)) for g in groups[row]]
                ax.bar(xs, [y[0] for y in ys], 0.38, yerr=[y[1] for y in ys], label=side)
            ax.set_xticks(range(len(groups[row])), groups[row], rotation=20, fontsize=8)
            ax.set(title=f"{row} {test}".strip(), ylabel="tokens/s")
            ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def print_summary(manifest: dict, output) -> None:
    console = make_console()
    parity = manifest["parity"]
    errors = parity["max_abs_logit_error"]
    console.print(f"wrote [bold]{output}[/] ({manifest['size_bytes'] / 1e6:.2f} MB, "
                  f"{manifest['target']}, {manifest['form']}, {manifest['variant']} "
                  f"gamma_k={manifest['gamma_k']} gamma_q={manifest['gamma_q']}, "
                  f"max_seq_len {manifest['max_seq_len']}) in {manifest['export_seconds']} s")
    agreement = ""
    if parity.get("min_agreement") is not None:
        a, d = parity["argmax_agreement"], parity["decided_argmax_agreement"]
        agreement = (f"; argmax agreement {a['all_at_once']:.3f} / {a['token_by_token']:.3f}, "
                     f"on the {parity['decided_positions']} decided positions "
                     f"{d['all_at_once']:.3f} / {d['token_by_token']:.3f} (needs >= "
                     f"{parity['min_agreement']})")
    console.print(f"parity vs eager fp32 on a {parity['probe_len']}-token probe: max |dlogit| "
                  f"all at once {errors['all_at_once']:.2e}, token by token "
                  f"{errors['token_by_token']:.2e} (tolerance {parity['tolerance']:.2e})"
                  f"{agreement} -> {'PASS' if parity['passed'] else 'FAIL'}")
    if manifest.get("quantization"):
        qrec = manifest["quantization"]
        console.print(f"quantization {qrec['scheme']}: weights {qrec['weights']}, activations "
                      f"{qrec['activations']}; quantized ops {qrec['quantized_ops']}; shear "
                      f"{'fp32' if qrec['keep_shear_fp32'] else 'int8'}")
    if manifest.get("delegation"):
        print_delegation(console, manifest["delegation"])


def print_delegation(console, d: dict) -> None:
    console.print(f"delegation: {d['delegated_subgraphs']} {d['backend']} subgraph(s), "
                  f"{d['delegated_nodes']} of {d['delegated_nodes'] + d['non_delegated_nodes']} "
                  f"nodes delegated ({100 * d['delegated_fraction']:.1f}%)")
    if d["ops_outside_delegate"]:
        table = Table("op outside the delegate", "count", "why")
        for op, entry in d["ops_outside_delegate"].items():
            table.add_row(op, str(entry["count"]), entry["why"] or "[red]unexplained[/]")
        console.print(table)


def print_inspection(info: dict) -> None:
    console = make_console()
    m = info["manifest"]
    head = Table(title=f"{Path(info['artifact']).name}", show_header=False)
    for key in ("target", "form", "variant", "gamma_q", "gamma_k", "twin", "max_seq_len",
                "quantization", "size_bytes"):
        head.add_row(key, str(m.get(key)))
    head.add_row("source checkpoint", f"{m['source_checkpoint']['checkpoint']} "
                 f"(sha256 {m['source_checkpoint']['sha256'][:12]}...)")
    head.add_row("parity max abs err", str(m["parity"]["max_abs_logit_error"]))
    console.print(head)
    io = Table("kind", "name", "shape", "dtype", title="I/O signature")
    for e in info["io"]:
        io.add_row(e["kind"], e["name"], str(e["shape"]), e["dtype"])
    console.print(io)
    ops = Table("op", "count", title="op histogram")
    for op, count in info["ops"].items():
        ops.add_row(op, str(count))
    console.print(ops)
    if info["delegation"]:
        print_delegation(console, info["delegation"])


def quant_check_table(result: dict) -> None:
    m = result["metrics"]
    console = make_console()
    task = result["task"]
    table = Table("metric", "float (reference)", f"artifact ({result['quantization']})", "delta",
                  title=f"quant-check {Path(result['artifact']).name}: {task['name']}, "
                        f"{result['samples']} held-out sequences x {result['tokens_per_sample']}"
                        f" tokens, token by token")
    table.add_row("task accuracy", f"{m['accuracy_float']:.4f}", f"{m['accuracy_artifact']:.4f}",
                  f"{m['accuracy_delta_points']:+.2f} points")
    table.add_row("target perplexity (scored positions)", f"{m['target_perplexity_float']:.4f}",
                  f"{m['target_perplexity_artifact']:.4f}",
                  f"x {m['target_perplexity_ratio']:.4f}")
    for label, value in (("top-1 agreement", f"{m['top1_agreement']:.4f}"),
                         ("KL(float || artifact) mean / p99 / max",
                          f"{m['kl_mean']:.2e} / {m['kl_p99']:.2e} / {m['kl_max']:.2e}"),
                         ("RMS dp on the reference's top token", f"{m['rms_dp_top']:.4f}"),
                         ("max abs logit error", f"{m['max_abs_logit_error']:.4f}")):
        table.add_row(label, "", value, "")
    console.print(table)
    limits = result["thresholds"]
    verdict = "PASS" if result["passed"] else "FAIL"
    ppl = (f", perplexity increase <= {limits['max_ppl_increase']:.0%}"
           if limits.get("max_ppl_increase") is not None else "")
    console.print(f"{verdict}: accuracy drop <= {limits['max_acc_drop']:g} points, top-1 "
                  f"agreement >= {limits['min_top1']:g}{ppl}")
