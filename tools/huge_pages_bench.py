"""Decode with and without huge pages under the weights: docs/runtime.md's huge-pages block.

    .venv/bin/python tools/huge_pages_bench.py   # ~8 min on 2 cores

A loaded program's memory is collapsed into transparent huge pages unless
`PSA_EDGE_HUGE_PAGES=0` (psa_edge/backends/huge_pages.py). Per build, `--processes` fresh
processes of `psa-edge bench -p P -n N -r R --threads 1` run with it off and on, taking turns:
how fast a process decodes depends on where its pages landed, so the block gives each setting's
slowest, median and fastest process, their peak RSS (VmHWM, the largest) and the memory the
report found on huge pages at the end of the run (AnonHugePages, the median process's).
"""

from __future__ import annotations

import argparse
import statistics

from common import MAX_LEN, artifact, commit, machine, psa_edge_json, write_block

BUILDS = (("psa-4m", "xnnpack", "int4", "runner"), ("psa-30m", "xnnpack", None, "runner"),
          ("psa-30m", "onnx", None, "fused"), ("psa-92m", "xnnpack", "int4", "runner"),
          ("psa-92m", "onnx", "int4", "fused"))
NAMES = {"xnnpack": "ExecuTorch XNNPACK", "onnx": "ONNX Runtime"}


def run(build, huge_pages: bool, args) -> tuple[float, float, float]:
    """Decode tokens/s, peak RSS (MB) and memory on huge pages (MB) of one bench process."""
    report = psa_edge_json("bench", build, "-p", args.p, "-n", args.n, "-r", args.r,
                           "--threads", 1, env={"PSA_EDGE_HUGE_PAGES": str(int(huge_pages))})
    return (report["results"][0][f"tg{args.n}"]["tokens_per_second"],
            report["peak_rss_bytes"] / 2**20, report["huge_pages"]["anon_huge_bytes"] / 2**20)


def row(preset, target, quant, form, args) -> str:
    build = artifact(preset, target, quant, False, form)
    samples = {False: [], True: []}
    for i in range(args.processes):
        for huge_pages in (i % 2 == 0, i % 2 != 0):  # which goes first alternates
            samples[huge_pages].append(run(build, huge_pages, args))
    cells = []
    for huge_pages in (False, True):
        rates = sorted(rate for rate, _, _ in samples[huge_pages])
        cells.append(f"{rates[0]:.0f} / {statistics.median(rates):.0f} / {rates[-1]:.0f}")
    gain = (statistics.median(r for r, _, _ in samples[True])
            / statistics.median(r for r, _, _ in samples[False]))
    rss = " / ".join(f"{max(m for _, m, _ in samples[h]):.0f}" for h in (False, True))
    huge = " / ".join(f"{statistics.median(m for _, _, m in samples[h]):.0f}"
                      for h in (False, True))
    return (f"| {preset} | {NAMES[target]}, {form} form | {quant or 'fp32'} | {cells[0]} | "
            f"{cells[1]} | **{gain:.2f}** | {rss} | {huge} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="Processes per setting.")
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=3)
    args = parser.parse_args()
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, not {args.processes}")
    lines = ["| preset | build | precision | decode t/s, small pages: slowest / median / "
             "fastest process | the same, huge pages | median, huge / small | peak RSS MB, "
             "small / huge | MB on huge pages, small / huge |", "|---|---|---|---|---|---|---|---|"]
    for build in BUILDS:
        lines.append(row(*build, args))
        print(lines[-1], flush=True)
    write_block("huge-pages", f"{machine()}, commit {commit()}, 1 thread, PSA builds of "
                f"docs/benchmarks.md at max length {MAX_LEN}: `psa-edge bench -p {args.p} "
                f"-n {args.n} -r {args.r}` in {args.processes} fresh processes per setting, "
                "taking turns (`PSA_EDGE_HUGE_PAGES=0`: small pages).\n\n" + "\n".join(lines),
                "docs/runtime.md")


if __name__ == "__main__":
    main()
