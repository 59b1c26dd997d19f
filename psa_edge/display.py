"""Terminal presentation shared by the commands: progress bars (rich only, no torch).

Contract: `progress_bar(label, total, enabled)` is a context manager yielding `advance()`;
with `enabled=False` (e.g. under `--json`) it draws nothing and `advance` does nothing.
"""

from __future__ import annotations

import contextlib


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
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True)
    checks = Table("check", "what", "measured", "tolerance", "result",
                   title=f"verify {report['artifact']} ({report['backend']}, "
                         f"{report['quantization']}) against {report['reference']}")
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
