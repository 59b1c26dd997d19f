"""docs/results/overview.md's export and verify blocks, from the shipped default model: `export`
runs the commands a user runs into out/ for every target and form (sizes, parity, the XNNPACK
delegation and every op left outside it with why); `verify` runs `psa-edge verify` on every
float artifact with its twin (full output for ONNX, PASS/FAIL per check on every target).

    .venv/bin/python tools/default_model.py export
    .venv/bin/python tools/default_model.py verify
"""

from __future__ import annotations

import argparse
import json

from common import DEFAULT_MODEL, OUT, REPO, psa_edge, psa_edge_json, write_block

EXPORTS = [  # (label, artifact folder under out/, extra arguments)
    ("onnx", "psa-default-onnx", ["--target", "onnx"]),
    ("onnx twin", "psa-default-onnx-twin", ["--target", "onnx", "--twin"]),
    ("xnnpack", "psa-default-xnnpack", ["--target", "xnnpack"]),
    ("xnnpack twin", "psa-default-xnnpack-twin", ["--target", "xnnpack", "--twin"]),
    ("portable", "psa-default-portable", ["--target", "portable"]),
    ("xnnpack runner form", "psa-default-runner", ["--target", "xnnpack", "--form", "runner"]),
    ("onnx fused form", "psa-default-onnx-fused", ["--target", "onnx", "--form", "fused"]),
    ("xnnpack int8", "psa-default-xnnpack-int8", ["--target", "xnnpack", "--quantize", "int8"]),
    ("onnx int8", "psa-default-onnx-int8", ["--target", "onnx", "--quantize", "int8"]),
    ("xnnpack int4", "psa-default-xnnpack-int4", ["--target", "xnnpack", "--quantize", "int4"]),
    ("onnx fused int4", "psa-default-onnx-fused-int4",
     ["--target", "onnx", "--form", "fused", "--quantize", "int4"]),
]
VERIFIED = ["onnx", "xnnpack", "portable", "xnnpack runner form", "onnx fused form"]


def export() -> str:
    model = DEFAULT_MODEL.relative_to(REPO)
    lines = ["```sh"] + [f".venv/bin/psa-edge export {model} {' '.join(extra)} -o out/{name}"
                         for _, name, extra in EXPORTS]
    lines += [".venv/bin/psa-edge inspect out/psa-default-xnnpack", "```", "",
              "Parity is the export-time probe's max abs logit error against the float "
              "reference (fp32: tolerance 1e-4 x the logit scale; int8: a quarter of the logit "
              "scale, int4 half of it, plus argmax agreement where the reference is decided, "
              "see the int8 section):", "",
              "| artifact | target | form | size (MB) | export (s) | parity: all at once | "
              "token by token |", "|---|---|---|---|---|---|---|"]
    manifests = {}
    for label, name, extra in EXPORTS:
        m = manifests[label] = psa_edge_json("export", model, *extra, "-o", OUT / name)
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
    lines += [f"| `{op}` | {e['count']} | {e['why']} |"
              for op, e in d["ops_outside_delegate"].items()]
    decode = d["methods"]["decode"]
    slices = decode["ops_outside_delegate"].get("aten_slice_copy_tensor", {}).get("count", 0)
    lines += ["", f"That is method `forward` (any chunk length). Method `decode` (one token, "
              f"what each decode step runs): {decode['delegated_subgraphs']} delegated "
              f"subgraphs, {decode['delegated_nodes']} of "
              f"{decode['delegated_nodes'] + decode['non_delegated_nodes']} nodes, "
              f"{slices} slices outside XNNPACK."]
    return "\n".join(lines) + "\n"


def ensure(name: str, extra: list[str]) -> str:
    if not (OUT / name / "manifest.json").exists():
        psa_edge("export", DEFAULT_MODEL, *extra, "-o", OUT / name)
    return str((OUT / name).relative_to(REPO))


def verify() -> str:
    summary = ["| target | " + " | ".join(["1. parity", "2. prefix reuse", "3. rollback",
                                           "4. cache parity", "5. speculative"]) + " | exit |",
               "|---|---|---|---|---|---|---|"]
    shown = ""
    for label, name, extra in (e for e in EXPORTS if e[0] in VERIFIED):
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
    return (f"{shown}\n\nEvery target (measured error of each check in brackets; tolerance "
            f"1e-4 x the logit scale, cache parity exact):\n\n" + "\n".join(summary) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("export", "verify"))
    part = parser.parse_args().part
    OUT.mkdir(exist_ok=True)
    block = export() if part == "export" else verify()
    write_block(part, block)
    print(block)


if __name__ == "__main__":
    main()
