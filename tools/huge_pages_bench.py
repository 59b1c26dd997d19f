"""Decode with and without huge pages under the weights: docs/runtime.md's huge-pages block.

    .venv/bin/python tools/huge_pages_bench.py   # ~8 min on 2 cores
    .venv/bin/python tools/huge_pages_bench.py --llama-cpp --processes 10   # ~2 min, after
                                             # tools/llama_cpp_bench.py wrote its GGUFs

A loaded program's memory is collapsed into transparent huge pages unless
`PSA_EDGE_HUGE_PAGES=0` (psa_edge/backends/huge_pages.py). Per build, `--processes` fresh
processes of `psa-edge bench -p P -n N -r R --threads 1` run with it off and on, taking turns:
how fast a process decodes depends on where its pages landed, so the block gives each setting's
slowest, median and fastest process, their peak RSS (VmHWM, the largest) and the memory the
report found on huge pages at the end of the run (AnonHugePages, the median process's).

`--llama-cpp`: the same question for llama-bench on the GGUFs `tools/llama_cpp_bench.py` wrote,
in three settings taking turns: as that tool runs it (the weights read through an mmap of the
file, whose pages the page cache chooses), `-lm none` (read into anonymous memory, small pages
where THP is "madvise"), and `-lm none` with glibc advising its allocations MADV_HUGEPAGE.
"""

from __future__ import annotations

import argparse
import statistics

from common import MAX_LEN, artifact, commit, machine, psa_edge_json, write_block

BUILDS = (("psa-4m", "xnnpack", "int4", "runner"), ("psa-30m", "xnnpack", None, "runner"),
          ("psa-30m", "onnx", None, "fused"), ("psa-92m", "xnnpack", "int4", "runner"),
          ("psa-92m", "onnx", "int4", "fused"))
NAMES = {"xnnpack": "ExecuTorch XNNPACK", "onnx": "ONNX Runtime"}
GGUFS = (("psa-30m", "F32"), ("psa-30m", "Q4_0"), ("psa-92m", "Q4_0"))
# llama-bench settings: (name, its load-mode arguments, environment added)
LLAMA_SETTINGS = (("mmap of the GGUF (as shipped)", (), {}),
                  ("-lm none", ("-lm", "none"), {}),
                  ("-lm none, glibc.malloc.hugetlb=1", ("-lm", "none"),
                   {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}))


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


def llama_cpp_row(preset: str, kind: str, args) -> str:
    """One GGUF's decode tokens/s in each llama-bench setting: median process (of
    `--processes`, the settings taking turns) and the median's ratio to the first setting's."""
    from llama_cpp_bench import build_llama_cpp, gguf_builds, llama_bench

    binaries = build_llama_cpp()
    gguf = gguf_builds(preset, binaries)[kind]
    decode_only = argparse.Namespace(p=0, n=args.n, r=args.r)
    rates = {name: [] for name, _, _ in LLAMA_SETTINGS}
    for i in range(args.processes):
        settings = LLAMA_SETTINGS if i % 2 == 0 else LLAMA_SETTINGS[::-1]
        for name, load_mode, env in settings:
            rates[name].append(llama_bench(binaries, gguf, 1, decode_only, extra=load_mode,
                                           env=env)["tg"])
    medians = [statistics.median(rates[name]) for name, _, _ in LLAMA_SETTINGS]
    cells = [f"{m:.0f} ({m / medians[0]:.2f})" for m in medians]
    return f"| {preset} | {kind} | " + " | ".join(cells) + " |"


def llama_cpp_block(args) -> None:
    lines = ["| preset | type | " + " | ".join(f"{name}: t/s (/ as shipped)"
                                             for name, _, _ in LLAMA_SETTINGS) + " |",
             "|---|---|" + "---|" * len(LLAMA_SETTINGS)]
    for preset, kind in GGUFS:
        lines.append(llama_cpp_row(preset, kind, args))
        print(lines[-1], flush=True)
    write_block("huge-pages-llama-cpp", f"{machine()}, commit {commit()}, 1 thread: llama-bench "
                f"-p 0 -n {args.n} -r {args.r}, median of {args.processes} processes per "
                "setting, the settings taking turns.\n\n" + "\n".join(lines), "docs/runtime.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=5, help="Processes per setting.")
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=3)
    parser.add_argument("--llama-cpp", action="store_true",
                        help="llama-bench's load modes instead of psa-edge's builds")
    args = parser.parse_args()
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, not {args.processes}")
    if args.llama_cpp:
        return llama_cpp_block(args)
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
