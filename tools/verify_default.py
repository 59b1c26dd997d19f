"""The README's verify block: `psa-edge verify` on the default model's float artifacts of every
target and form, each with its twin for the cache table.

Uses the artifacts tools/export_default.py writes to out/ (missing ones are exported here),
runs the command a user runs, and writes the full output for ONNX and a PASS/FAIL summary of
every check on every target.

    .venv/bin/python tools/verify_default.py
"""

from __future__ import annotations

import json

from common import DEFAULT_MODEL, OUT, REPO, psa_edge, write_block

TARGETS = [  # (label, artifact folder under out/, export arguments of it and its twin)
    ("onnx", "psa-default-onnx", ["--target", "onnx"]),
    ("xnnpack", "psa-default-xnnpack", ["--target", "xnnpack"]),
    ("portable", "psa-default-portable", ["--target", "portable"]),
    ("xnnpack runner form", "psa-default-runner", ["--target", "xnnpack", "--form", "runner"]),
]


def ensure(name: str, extra: list[str]) -> str:
    if not (OUT / name / "manifest.json").exists():
        psa_edge("export", DEFAULT_MODEL, *extra, "-o", OUT / name)
    return str((OUT / name).relative_to(REPO))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    summary = ["| target | " + " | ".join(["1. parity", "2. prefix reuse", "3. rollback",
                                           "4. cache parity", "5. speculative"]) + " | exit |",
               "|---|---|---|---|---|---|---|"]
    shown = ""
    for label, name, extra in TARGETS:
        args = ["verify", ensure(name, extra), "--twin", ensure(f"{name}-twin",
                                                                 extra + ["--twin"])]
        report = json.loads(psa_edge(*args, "--json", check=False).stdout)
        cells = [f"{'PASS' if c['passed'] else 'FAIL'} ({c['error']:.1e})"
                 for c in report["checks"]]
        summary.append(f"| {label} | " + " | ".join(cells) +
                       f" | {0 if report['passed'] else 1} |")
        if label == "onnx":
            shown = (f"```\n$ psa-edge {' '.join(args)}\n"
                     + psa_edge(*args, check=False).stdout.rstrip() + "\n```")
    block = (f"{shown}\n\nEvery target (measured error of each check in brackets; tolerance "
             f"1e-4 x the logit scale, cache parity exact):\n\n" + "\n".join(summary) + "\n")
    write_block("verify", block)
    print(block)


if __name__ == "__main__":
    main()
