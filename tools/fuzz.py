"""docs/results/reliability.md: the fuzz campaign's table and the cost of the first-open check.

    .venv/bin/python tools/fuzz.py --cases 2400 --jobs 2     # about an hour on 2 cores

The campaign is tests/test_fuzz.py's fuzz test run with more cases than CI's sample. The
first-open check (psa_edge/runtime/guard.py) is timed on the shipped model: `psa-edge generate`
with an empty check cache (the child process runs) and a warm one, median of 3 each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DEFAULT_MODEL, OUT, REPO, commit, export_once, machine, write_doc

OUTCOMES = ("ok", "refused", "traceback", "signal", "hang", "wrong-exit-0", "left-files",
            "bad-refusal")


def campaign(cases: int, seed: int, jobs: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "results.json"
        env = {**os.environ, "PSA_EDGE_FUZZ_CASES": str(cases), "PSA_EDGE_FUZZ_SEED": str(seed),
               "PSA_EDGE_FUZZ_JOBS": str(jobs), "PSA_EDGE_FUZZ_REPORT": str(report)}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        "tests/test_fuzz.py::test_fuzzed_inputs_end_in_a_clean_result_or_a_"
                        "one_line_refusal"], cwd=REPO, env=env)
        return json.loads(report.read_text())


def open_cost() -> list[str]:
    (OUT / "fuzz").mkdir(parents=True, exist_ok=True)
    rows = []
    for target in ("onnx", "xnnpack"):
        folder = export_once(DEFAULT_MODEL, OUT / "fuzz" / target, target)
        times = {"first": [], "later": []}
        for _ in range(3):
            with tempfile.TemporaryDirectory() as cache:
                for kind in ("first", "later"):
                    started = time.perf_counter()
                    subprocess.run([sys.executable, "-m", "psa_edge.cli", "generate", folder,
                                    "--prompt-ids", "1", "-n", "1"], capture_output=True,
                                   check=True, env={**os.environ, "PSA_EDGE_CACHE": cache})
                    times[kind].append(time.perf_counter() - started)
        first, later = (statistics.median(times[k]) for k in ("first", "later"))
        rows.append(f"| {target} | {first:.2f} | {later:.2f} | {first - later:+.2f} |")
    return rows


def table(results: list[dict]) -> str:
    lines = ["| class | cases | " + " | ".join(OUTCOMES) + " |",
             "|---|---|" + "---|" * len(OUTCOMES)]
    for kind in (*sorted({r["class"] for r in results}), "all"):
        rows = [r for r in results if kind in ("all", r["class"])]
        counts = [sum(r["outcome"] == o for r in rows) for o in OUTCOMES]
        lines.append(f"| {'**all**' if kind == 'all' else kind} | {len(rows)} | "
                     + " | ".join(map(str, counts)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    started = time.time()
    results = campaign(args.cases, args.seed, args.jobs)
    cost = open_cost()
    failures = [r for r in results if r["outcome"] not in ("ok", "refused")]
    examples = "\n".join(f"- `{' '.join(r['argv'])}` ({r['class']}): {r['outcome']}, "
                         f"`{r['stderr']}`" for r in failures[:10]) or "None."
    write_doc("reliability.md", f"""# Reliability under bad input

Made by `.venv/bin/python tools/fuzz.py --cases {args.cases} --seed {args.seed} --jobs
{args.jobs}` on {machine()}, at commit {commit()}, in {(time.time() - started) / 60:.0f} min.
What is guaranteed and how: docs/reference/spec.md §9. The cases (tests/fuzz_cases.py): an
artifact's model file truncated, bit-flipped, zeroed or spliced with its manifest re-hashed
(`onnx-bytes`, `pte-bytes`); a damaged manifest; a damaged checkpoint or a file that is not
one; a damaged Hugging Face folder for import-hf (`hf-folder`: a config field, a file's
bytes, a missing file, a lying shard index); a damaged training state for `train --resume`
(`state`: a recorded option, a task parameter, the step, the history, the optimizer); an option
out of range; an output that is an input, a directory, unwritable, or on a full disk. `ok`:
exit 0 with what the undamaged input gives; `refused`: exit 2, one line; every other column is
a failure. CI runs a sample of the same generator beside the kill -9 tests (tests/test_fuzz.py).

{table(results)}

Failures (first 10):\n\n{examples}

The first-open check (a child process loads new bytes and compares their self-check
fingerprint; docs/reference/spec.md §9): wall time of `psa-edge generate --prompt-ids 1 -n 1`
on the shipped model, median of 3, in seconds.

| artifact | first open (child check) | later opens | cost of the check |
|---|---|---|---|
{chr(10).join(cost)}
""")
    print(table(results))


if __name__ == "__main__":
    main()
