"""Export the shipped default model to every target and write the README's export block.

Runs the same commands a user runs (`psa-edge export ... --json`), into out/ (ignored by git),
then writes the block between `<!-- export:begin -->` and `<!-- export:end -->` in README.md:
the artifacts with sizes and parity, and the XNNPACK delegation summary with every op left
outside the delegate and why.

    python tools/export_default.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "psa-default.pt"
OUT = REPO / "out"
EXPORTS = [  # (label, output file under out/, extra arguments)
    ("onnx", "psa-default.onnx", ["--target", "onnx"]),
    ("onnx twin", "psa-default.twin.onnx", ["--target", "onnx", "--twin"]),
    ("xnnpack", "psa-default.xnnpack.pte", ["--target", "xnnpack"]),
    ("xnnpack twin", "psa-default.xnnpack.twin.pte", ["--target", "xnnpack", "--twin"]),
    ("portable", "psa-default.portable.pte", ["--target", "portable"]),
    ("xnnpack runner form", "psa-default.runner.pte", ["--target", "xnnpack", "--form", "runner"]),
    ("xnnpack int8", "psa-default.int8.pte", ["--target", "xnnpack", "--quantize", "int8"]),
    ("onnx int8", "psa-default.int8.onnx", ["--target", "onnx", "--quantize", "int8"]),
]


def export(filename: str, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "psa_edge.cli", "export", str(MODEL), *extra, "-o",
           str(OUT / filename), "--json"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    lines = ["```sh"] + [f".venv/bin/psa-edge export models/psa-default.pt {' '.join(extra)} "
                         f"-o out/{filename}" for _, filename, extra in EXPORTS]
    lines += [".venv/bin/psa-edge inspect out/psa-default.xnnpack.pte", "```", "",
              "Parity is the export-time probe's max abs logit error against the float "
              "reference (fp32: tolerance 1e-4 x the logit scale; int8: a quarter of the logit "
              "scale, plus argmax agreement where the reference is decided, see the int8 "
              "section):", "",
              "| artifact | target | form | size (MB) | export (s) | parity: all at once | "
              "token by token |", "|---|---|---|---|---|---|---|"]
    manifests = {}
    for label, filename, extra in EXPORTS:
        m = manifests[label] = export(filename, extra)
        err = m["parity"]["max_abs_logit_error"]
        lines.append(f"| {label} | {m['target']} | {m['form']} | {m['size_bytes'] / 1e6:.2f} | "
                     f"{m['export_seconds']} | {err['all_at_once']:.1e} | "
                     f"{err['token_by_token']:.1e} |")
        print(label, "done", flush=True)
    d = manifests["xnnpack"]["delegation"]
    lines += ["", f"XNNPACK delegation of the default model (explicit-state form): "
              f"{d['delegated_subgraphs']} delegated subgraphs, {d['delegated_nodes']} of "
              f"{d['delegated_nodes'] + d['non_delegated_nodes']} graph nodes "
              f"({100 * d['delegated_fraction']:.1f}%). Every linear, the attention "
              "arithmetic (QK^T, scale, mask add, softmax, AV) and the shear's Sub/Mul/Add are "
              "inside the delegate (checked by tests/test_export.py); what stays outside:", "",
              "| op outside XNNPACK | count | why |", "|---|---|---|"]
    for op, entry in d["ops_outside_delegate"].items():
        lines.append(f"| `{op}` | {entry['count']} | {entry['why']} |")
    decode = d["methods"]["decode"]
    slices = decode["ops_outside_delegate"].get("aten_slice_copy_tensor", {}).get("count", 0)
    lines += ["", f"That is method `forward` (any chunk length). Method `decode` (one token, "
              f"what each decode step runs): {decode['delegated_subgraphs']} delegated "
              f"subgraphs, {decode['delegated_nodes']} of "
              f"{decode['delegated_nodes'] + decode['non_delegated_nodes']} nodes, "
              f"{slices} slices outside XNNPACK."]
    block = "\n".join(lines) + "\n"
    from psa_edge.io import write_marked_block

    write_marked_block(REPO / "README.md", "export", block)
    print(block)


if __name__ == "__main__":
    main()
