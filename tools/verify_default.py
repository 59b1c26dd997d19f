"""The README's verify block: `psa-edge verify` on the default model's float artifacts of every
target (ONNX, ExecuTorch XNNPACK, ExecuTorch portable), each with its twin for the cache table.

Uses the artifacts tools/export_default.py writes to out/ (run it first; missing ones are
exported here), runs the same command a user runs, and writes the block between
`<!-- verify:begin -->` and `<!-- verify:end -->` in README.md: the full output for ONNX and a
PASS/FAIL summary of every check on every target.

    python tools/verify_default.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "psa-default.pt"
OUT = REPO / "out"
TARGETS = [  # (label, artifact, its twin, export arguments of both)
    ("onnx", "psa-default.onnx", "psa-default.twin.onnx", ["--target", "onnx"]),
    ("xnnpack", "psa-default.xnnpack.pte", "psa-default.xnnpack.twin.pte", ["--target",
                                                                            "xnnpack"]),
    ("portable", "psa-default.portable.pte", "psa-default.portable.twin.pte", ["--target",
                                                                              "portable"]),
]


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "psa_edge.cli", *args], capture_output=True,
                          text=True, check=check, cwd=REPO)


def ensure(name: str, extra: list[str]) -> Path:
    path = OUT / name
    if not path.exists():
        cli("export", str(MODEL), *extra, "-o", str(path))
    return path


def main() -> None:
    OUT.mkdir(exist_ok=True)
    summary = ["| target | " + " | ".join(["1. parity", "2. prefix reuse", "3. rollback",
                                           "4. cache parity", "5. speculative"]) + " | exit |",
               "|---|---|---|---|---|---|---|"]
    shown = ""
    for label, name, twin_name, extra in TARGETS:
        artifact = ensure(name, extra)
        twin = ensure(twin_name, extra + ["--twin"])
        args = ["verify", str(artifact.relative_to(REPO)), "--twin",
                str(twin.relative_to(REPO))]
        report = json.loads(cli(*args, "--json", check=False).stdout)
        cells = [f"{'PASS' if c['passed'] else 'FAIL'} ({c['error']:.1e})"
                 for c in report["checks"]]
        summary.append(f"| {label} | " + " | ".join(cells) +
                       f" | {0 if report['passed'] else 1} |")
        if label == "onnx":
            shown = (f"```\n$ psa-edge {' '.join(args)}\n" + cli(*args, check=False).stdout
                     .rstrip() + "\n```")
    block = (f"{shown}\n\nEvery target (measured error of each check in brackets; tolerance "
             f"1e-4 x the logit scale, cache parity exact):\n\n" + "\n".join(summary) + "\n")
    from psa_edge.io import write_marked_block

    write_marked_block(REPO / "README.md", "verify", block)
    print(block)


if __name__ == "__main__":
    main()
