"""Terminal presentation shared by the commands: progress bars (rich only, no torch).

Contract: `progress_bar(label, total, enabled)` is a context manager yielding `advance()`;
with `enabled=False` (e.g. under `--json`) it draws nothing and `advance` does nothing.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


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


def verify_table(report: dict) -> None:
    from rich.table import Table

    console = make_console()
    reference = os.path.relpath(report["reference"])
    checks = Table("check", "what", "measured", "tolerance", "result",
                   title=f"verify {report['artifact']} ({report['backend']}, "
                         f"{report['quantization']}) against {reference}")
    for c in report["checks"]:
        what = c["detail"] + (f" [{c['note']}]" if c["note"] else "")
        checks.add_row(c["name"], what, f"{c['error']:.2e}", f"{c['tolerance']:.2e}",
                       "[green]PASS[/]" if c["passed"] else "[red]FAIL[/]")
    console.print(checks)
    cache = Table("length", "twin KV cache (bytes)", "PSA KV cache (bytes)",
                  "PSA extra slot (bytes)", "ratio", title=f"KV-cache size ({report['twin']})")
    for row in report["cache"]:
        cache.add_row(str(row["length"]), f"{row['twin_cache_bytes']:,}",
                      f"{row['psa_cache_bytes']:,}", f"{row['slot_bytes']:,}",
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
                  f"{r['size_bytes'] / 1e6:.2f}", report["threads"]]
        p, t = r[pp], r[tg]
        rows.append(common + [pp + at, f"{p['tokens_per_second']:.1f} ± {p['stddev']:.1f}", "",
                              "", f"{p['ttft_ms_mean']:.2f}", f"{r['load_rss_bytes'] / 1e6:.1f}"])
        rows.append(common + [tg + at, f"{t['tokens_per_second']:.1f} ± {t['stddev']:.1f}",
                              f"{t['latency_ms_p50']:.3f}", f"{t['latency_ms_p90']:.3f}", "",
                              f"{r['load_rss_bytes'] / 1e6:.1f}"])
    return header, rows


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


def bench_tables(report: dict, markdown: bool = False) -> None:
    from rich.table import Table

    header, rows = bench_rows(report)
    m = report["machine"]
    machine = (f"{m['cpu']}, {m['cores']} cores, {m['arch']}, {m['os']}; peak RSS "
               f"{report['peak_rss_bytes'] / 1e6:.0f} MB")
    ratios = ratio_rows(report)
    runner = runner_lines(report)
    if markdown:
        print(markdown_table(header, rows))
        if ratios:
            print()
            print(markdown_table(RATIO_HEADER, ratios))
        for line in runner:
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
    for line in runner:
        console.print(line)
    console.print(machine)


def bench_plot(reports: list[dict], path) -> None:
    """Grouped bars: tokens/s of each test per backend and precision, PSA beside its twin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from psa_edge.io import atomic_output

    groups, values = [], {}
    for report in reports:
        spec = report["spec"]
        for r in report["results"]:
            group = f"{r['target']} {r['precision']}"
            if group not in groups:
                groups.append(group)
            side = "twin (gamma 0)" if r["label"] == "twin" else "PSA"
            for test in (f"pp{spec['prompt']}", f"tg{spec['gen']}"):
                values[(test, side, group)] = (r[test]["tokens_per_second"], r[test]["stddev"])
    tests = sorted({k[0] for k in values}, key=lambda t: (t[:2] != "pp", t))
    fig, axes = plt.subplots(1, len(tests), figsize=(5 * len(tests), 3.8))
    axes = [axes] if len(tests) == 1 else axes
    for ax, test in zip(axes, tests):
        for j, side in enumerate(("PSA", "twin (gamma 0)")):
            xs = [i + (j - 0.5) * 0.38 for i in range(len(groups))]
            ys = [values.get((test, side, g), (0, 0)) for g in groups]
            ax.bar(xs, [y[0] for y in ys], 0.38, yerr=[y[1] for y in ys], label=side)
        ax.set_xticks(range(len(groups)), groups, rotation=20, fontsize=8)
        ax.set(title=test, ylabel="tokens/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
