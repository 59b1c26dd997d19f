"""The fuzz campaign's cases (tests/test_fuzz.py runs a sample, tools/fuzz.py the campaign).

Each case runs one `psa-edge` command in a fresh folder holding copies of a checkpoint and of
its ONNX and XNNPACK artifacts, one of them damaged (an artifact's bytes with its manifest
re-hashed, its manifest, the checkpoint), or a damaged Hugging Face folder (the checkpoint's
export-hf) for import-hf, or a damaged training state for `train --resume`, or with a bad
argument or output, or on a full disk.
Its outcome is `ok` (exit 0 with what the undamaged input gives), `refused` (exit 2 and one line
`error: ...` on stderr), or a failure: `traceback`, `signal` (a native abort), `hang` (past
TIMEOUT_S), `wrong-exit-0` (exit 0 on input that must be refused, or with other output),
`left-files` (a file left or changed that the command did not promise), `bad-refusal` (another
exit code, or more than one line). The same seed and count give the same cases.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 180
FSIZE_LIMIT = 64_000  # bytes a "full disk" lets a command write
FAILURES = ("traceback", "signal", "hang", "wrong-exit-0", "left-files", "bad-refusal")
GEN = ["generate", "{art}", "--prompt-ids", "1,2,3", "-n", "4"]
TRAIN = ["train", "--task", "ih-sht", "--steps", "2", "--eval-every", "1", "--eval-samples", "4",
         "--batch-size", "2"]
COMMANDS = {  # template -> (command, files a successful run may write)
    "generate": (GEN, ()), "inspect": (["inspect", "{art}", "--json"], ()),
    "generate-pt": (["generate", "model.pt", "--prompt-ids", "1,2", "-n", "3"], ()),
    "eval": (["eval", "model.pt", "--samples", "8", "--json"], ()),
    "export": (["export", "model.pt", "--target", "onnx", "-o", "new", "--json"], ("new",)),
    "bench": (["bench", "{art}", "-p", "4", "-n", "4", "-r", "1", "--json"], ()),
    "train": ([*TRAIN, "-o", "new.pt"], ("new.pt", "new.pt.json", "new.metrics.jsonl",
                                        "new.curve.png")),
    "import-hf": (["import-hf", "hf", "-o", "new.pt"], ("new.pt", "new.pt.json")),
    "resume": (["train", "--resume", "state.pt", "-o", "new.pt"],
               ("new.pt", "new.pt.json", "new.metrics.jsonl", "new.curve.png", "new.state.pt")),
}


# --- damage -----------------------------------------------------------------------------------

def damage_bytes(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    how = rng.choice(["truncate", "flip", "flip", "zero-run", "splice"])
    if how == "truncate":
        return bytes(data[:rng.randrange(len(data))])
    if how == "flip":
        for _ in range(rng.choice([1, 2, 8, 64])):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif how == "zero-run":
        i = rng.randrange(len(data))
        data[i:i + rng.choice([4, 64, 4096])] = bytes(min(len(data) - i, 4096))
    else:
        i, j = rng.randrange(len(data)), rng.randrange(len(data))
        data[i:i + 256] = data[j:j + 256]
    return bytes(data)


def rehash(folder: Path, name: str) -> None:
    """Make the manifest agree with the damaged file: the adversary's best case."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))


JUNK = [0, -1, 1.5, "8", None, [], {}, True, 10**9, 2**63, float("nan"), float("inf"), -10**6]
INVALID = [-1, "8", None, [], {}, float("nan"), float("inf"), -10**6]
SEMANTIC_FIELDS = {"rope_theta", "rms_norm_eps", "gamma_q", "gamma_k", "eos_token_id",
                   "bos_token_id", "max_position_embeddings"}


def damage_manifest(rng: random.Random, manifest: dict):
    how = rng.choice(["whole", "drop", "config", "config", "io", "field", "files"])
    if how == "whole":
        return rng.choice([[], None, "manifest", 5, b"\xff\xfe{".decode("latin-1")])
    manifest = json.loads(json.dumps(manifest))
    if how == "drop":
        manifest.pop(rng.choice(sorted(manifest)))
    elif how == "config":
        key = rng.choice(sorted(manifest["config"]))
        manifest["config"][key] = rng.choice(JUNK + [manifest["config"][key] * 2
                                                     if isinstance(manifest["config"][key], int)
                                                     else "x"])
    elif how == "io":
        block = manifest["io"]
        key = rng.choice(sorted(block))
        block[key] = rng.choice(JUNK + [["input_ids"], {"x": 1}])
    elif how == "field":
        key = rng.choice(["target", "form", "backend", "max_seq_len", "self_check", "twin",
                          "quantization", "gamma_k"])
        manifest[key] = rng.choice(JUNK + ["onnx", "xnnpack", "runner", "executorch"])
    else:
        manifest["files"] = rng.choice(JUNK + [{"model.onnx": "0" * 64}])
    return manifest


def damage_checkpoint(rng: random.Random, payload: dict):
    """A damaged checkpoint payload, or raw bytes, or a special file kind (a str)."""
    import copy

    import torch

    how = rng.choice(["config", "config", "tensors", "tensors", "fields", "file"])
    payload = copy.deepcopy(payload)
    if how == "config":
        key = rng.choice(sorted(payload["config"]))
        # A valid value of a field that is the model's to choose (1.5 as rope_theta, 0 as an
        # eos id) makes another model, rightly run; those fields get only invalid values.
        semantic = key in SEMANTIC_FIELDS
        payload["config"][key] = rng.choice(INVALID if semantic else JUNK + ["x", 0.0])
    elif how == "tensors":
        sd = payload["state_dict"]
        name = rng.choice(sorted(sd))
        change = rng.choice(["int-key", "drop", "complex", "int", "shape", "nan", "extra"])
        if change == "int-key":
            sd[7] = sd[name]
        elif change == "drop":
            del sd[name]
        elif change == "complex":
            sd[name] = sd[name].to(torch.complex64)
        elif change == "int":
            sd[name] = sd[name].to(torch.int32)
        elif change == "shape":
            sd[name] = sd[name].reshape(-1)[:-1].clone()
        elif change == "nan":
            sd[name] = sd[name].clone().fill_(float("nan"))
        else:
            sd["model.layers.0.self_attn.extra.weight"] = torch.zeros(2, 2)
    elif how == "fields":
        key = rng.choice(["format", "version", "tokenizer", "metadata", "config", "state_dict"])
        payload[key] = rng.choice(JUNK + ["{}", "psa-edge-checkpoint"])
    else:
        return rng.choice(["text", "empty", "directory", "fifo", "symlink-loop", "truncated",
                           "random", "pickle"])
    return payload


HF_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def damage_hf(rng: random.Random, folder: Path) -> None:
    """Damage a save_pretrained folder in place: a config field, a file's bytes, a missing
    file, a junk config, or a shard index that lies."""
    how = rng.choice(["config", "config", "bytes", "bytes", "drop", "whole", "index"])
    config = json.loads((folder / "config.json").read_text())
    if how == "config":
        key = rng.choice(sorted(config) + ["rope_scaling", "attention_bias", "head_dim"])
        config[key] = rng.choice(JUNK + ["x", {"rope_type": "linear", "factor": 2.0}])
        (folder / "config.json").write_text(json.dumps(config, allow_nan=True))
    elif how == "bytes":
        target = folder / rng.choice(HF_FILES)
        target.write_bytes(damage_bytes(rng, target.read_bytes()))
    elif how == "drop":
        (folder / rng.choice(HF_FILES)).unlink()
    elif how == "whole":
        (folder / "config.json").write_text(json.dumps(rng.choice(JUNK)))
    else:
        shard = rng.choice(["model.safetensors", "missing.safetensors", "../model.pt", "", 7,
                            "/etc/passwd"])
        index = rng.choice([{"weight_map": {"lm_head.weight": shard}}, {"weight_map":
                            rng.choice(JUNK)}, {"metadata": {}}, rng.choice(JUNK)])
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def damage_state(rng: random.Random, state: dict) -> dict:
    """A training state with one field junk: a recorded option, a task parameter, the step, a
    history row, the optimizer's state."""
    import copy

    state = copy.deepcopy(state)
    how = rng.choice(["spec", "spec", "task", "step", "history", "optimizer"])
    if how == "spec":
        spec = state["metadata"]["spec"]
        spec[rng.choice(sorted(spec) + ["unknown"])] = rng.choice(JUNK + ["x"])
    elif how == "task":
        params = state["metadata"]["task"]["params"]
        params[rng.choice(sorted(params))] = rng.choice(JUNK)
    elif how == "step":
        state["step"] = rng.choice(JUNK + [10**6])
    elif how == "history":
        state["history"] = [rng.choice(JUNK + [{"step": "x"}])]
    elif rng.random() < 0.5:
        optimizer = state["optimizer"]
        optimizer[rng.choice(sorted(optimizer))] = rng.choice(JUNK)
    else:  # one parameter's AdamW moments
        import torch

        moments = state["optimizer"]["state"][0]
        key = rng.choice(sorted(moments))
        moments[key] = rng.choice(JUNK + [torch.zeros(3), moments[key].reshape(-1)[:-1],
                                          torch.full_like(moments[key], float("nan")),
                                          -moments[key] - 1])
    return state


class Evil:
    """A pickle that would run code on load: it must never run."""

    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def write_checkpoint(path: Path, damaged, rng: random.Random, original: Path) -> None:
    import pickle

    import torch

    if not isinstance(damaged, str):
        torch.save(damaged, path)
    elif damaged == "directory":
        path.mkdir()
    elif damaged == "fifo":
        os.mkfifo(path)
    elif damaged == "symlink-loop":
        path.symlink_to(path.name)
    elif damaged == "pickle":
        path.write_bytes(pickle.dumps({"format": "psa-edge-checkpoint", "x": Evil()}))
    else:
        data = original.read_bytes()
        path.write_bytes({"text": b"hello\n", "empty": b"", "random": rng.randbytes(4096),
                          "truncated": data[:rng.randrange(len(data))]}[damaged])


# --- cases ------------------------------------------------------------------------------------

BAD_ARGS = [  # (template, option, values that must be refused)
    ("generate", "--temperature", ["nan", "-1", "inf", "1e400", "abc"]),
    ("generate", "--top-p", ["0", "-0.5", "2", "nan"]), ("generate", "--top-k", ["0", "-3"]),
    ("generate", "--seed", ["-1", str(2**64)]), ("generate", "--threads", ["0", "-1", "100000"]),
    ("generate", "-n", ["-1", "1000000000"]), ("generate", "--draft-len", ["0", "-2"]),
    ("generate", "--prompt-ids", ["", "a,b", "-1", "99999", "1,,2", "1.5"]),
    ("bench", "--depth", ["-1", "1000000"]), ("bench", "-p", ["0", "-4"]),
    ("bench", "-r", ["0", "-1"]), ("bench", "--threads", ["0", "-1", "100000"]),
    ("eval", "--samples", ["0", "-5"]), ("eval", "--seed", ["-1"]),
    ("export", "--max-seq-len", ["0", "1", "-3", "100000000"]),
    ("export", "--target", ["tpu", ""]), ("export", "--quantize", ["int3", "fp8"]),
    ("export", "--form", ["eager"]), ("export", "--calibration-samples", ["0", "-1"]),
    ("export", "--group-size", ["48", "0", "-32", "64"]),
    ("train", "--device", ["tpu", "cuda:", "cuda:x", "CPU", ""]),
    ("train", "--weights-dtype", ["int8", "float64", ""]),
    ("train", "--text", ["missing", "missing/*.py"]), ("train", "--preset", ["psa-1b", ""]),
    ("train", "--seq-len", ["1", "-1"]), ("train", "--lr", ["0", "nan", "-1"]),
]
BAD_OUTPUTS = [  # (command, must a run refuse) in a folder holding model.pt and art/
    (["export", "model.pt", "--target", "onnx", "-o", "model.pt"], True),
    (["export", "model.pt", "--target", "onnx", "-o", "."], True),
    (["export", "model.pt", "--target", "onnx", "-o", "/proc/psa-edge-out"], True),
    (["export", "model.pt", "--target", "onnx", "-o", "missing/dir/out"], True),
    (["export", "model.pt", "--target", "onnx", "-o", "model.pt.json"], True),
    ([*TRAIN, "-o", "model.pt", "--init", "model.pt"], True),
    ([*TRAIN, "-o", "/proc/x.pt"], True), ([*TRAIN, "-o", "."], True),
    ([*TRAIN, "-o", "missing/new.pt"], True),
    (["bench", "{art}", "-p", "4", "-n", "4", "-r", "1", "--plot", "{art}/model.onnx"], True),
    (["export-hf", "model.pt", "-o", "."], True), (["bundle", "{art}", "-o", "{art}"], True),
    (["import-hf", "{art}", "-o", "{art}/tokenizer.json"], True),
]
FULL_DISK = [["export", "model.pt", "--target", "onnx", "-o", "new"],
             [*TRAIN, "-o", "new.pt"],
             ["export-hf", "model.pt", "-o", "hf"]]
CLASSES = {"onnx-bytes": 5, "pte-bytes": 1, "manifest": 5, "checkpoint": 2, "argument": 4,
           "output": 1, "hf-folder": 2, "state": 1}


def make_case(rng: random.Random, index: int) -> dict:
    """One case: its class, how to set its folder up (`damage`) and its command."""
    kind = rng.choices(list(CLASSES), weights=list(CLASSES.values()))[0]
    case = {"index": index, "class": kind, "art": "onnx", "expect": "same-or-refuse",
            "template": "generate", "fsize": None}
    if kind in ("onnx-bytes", "pte-bytes"):
        case["art"] = "onnx" if kind == "onnx-bytes" else "xnnpack"
        case["template"] = rng.choice(["generate", "generate", "inspect"])
        case["damage"] = ("bytes", rng.getrandbits(32))
    elif kind == "manifest":
        case["art"] = rng.choice(["onnx", "onnx", "xnnpack"])
        case["template"] = rng.choice(["generate", "inspect", "bench"])
        case["damage"] = ("manifest", rng.getrandbits(32))
    elif kind == "checkpoint":
        case["template"] = rng.choice(["generate-pt", "eval", "eval", "export"])
        case["damage"] = ("checkpoint", rng.getrandbits(32))
    elif kind == "hf-folder":
        case.update(template="import-hf", damage=("hf", rng.getrandbits(32)))
    elif kind == "state":
        case.update(template="resume", damage=("state", rng.getrandbits(32)))
    elif kind == "argument":
        template, option, values = rng.choice(BAD_ARGS)
        case.update(template=template, expect="refuse",
                    extra=[option, rng.choice(values)], damage=None)
    else:
        if rng.random() < 0.3:
            case.update(argv=rng.choice(FULL_DISK), fsize=FSIZE_LIMIT, expect="refuse",
                        damage=None)
        else:
            argv, _ = rng.choice(BAD_OUTPUTS)
            case.update(argv=argv, expect="refuse", damage=None)
    return case


def setup(case: dict, folder: Path, sources: dict, payload: dict) -> None:
    shutil.copyfile(sources["checkpoint"], folder / "model.pt")
    shutil.copyfile(f"{sources['checkpoint']}.json", folder / "model.pt.json")
    shutil.copytree(sources[case["art"]], folder / "art")
    if case["template"] == "import-hf":
        shutil.copytree(sources["hf"], folder / "hf")
    damage = case.get("damage")
    if not damage:
        return
    rng = random.Random(damage[1])
    if damage[0] == "hf":
        damage_hf(rng, folder / "hf")
    elif damage[0] == "state":
        import torch

        torch.save(damage_state(rng, torch.load(sources["state"], weights_only=True)),
                   folder / "state.pt")
    elif damage[0] == "bytes":
        name = "model.onnx" if case["art"] == "onnx" else "model.pte"
        target = folder / "art" / name
        target.write_bytes(damage_bytes(rng, target.read_bytes()))
        rehash(folder / "art", name)
    elif damage[0] == "manifest":
        path = folder / "art" / "manifest.json"
        damaged = damage_manifest(rng, json.loads(path.read_text()))
        text = json.dumps(damaged, allow_nan=True)
        path.write_bytes(text.encode() if rng.random() < 0.9 else b"\xff" + text.encode())
    else:
        (folder / "model.pt").unlink()
        write_checkpoint(folder / "model.pt", damage_checkpoint(rng, payload), rng,
                         sources["checkpoint"])


def environment(cache: str) -> dict:
    return {**os.environ, "PSA_EDGE_CACHE": cache, "COLUMNS": "100",
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def argv_of(case: dict) -> list[str]:
    argv = case.get("argv") or COMMANDS[case["template"]][0] + case.get("extra", [])
    return [a.replace("{art}", "art") for a in argv]


def files_of(folder: Path) -> dict:
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            out[rel] = "special"
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def run(case: dict, sources: dict, payload: dict, baselines: dict, cache: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="psa-edge-fuzz-") as tmp:
        folder = Path(tmp)
        setup(case, folder, sources, payload)
        before = files_of(folder)

        def limits():
            if case["fsize"]:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails: EFBIG
                resource.setrlimit(resource.RLIMIT_FSIZE, (case["fsize"], case["fsize"]))

        started = time.time()
        try:
            result = subprocess.run([sys.executable, "-m", "psa_edge.cli", *argv_of(case)],
                                    cwd=folder, capture_output=True, text=True,
                                    timeout=TIMEOUT_S, preexec_fn=limits,
                                    env=environment(cache))
            code, out, err = result.returncode, result.stdout, result.stderr
        except subprocess.TimeoutExpired:
            code, out, err = None, "", ""
        after = files_of(folder)
    promised = COMMANDS.get(case["template"], (None, ()))[1] if not case.get("argv") else ()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                     and not (code == 0 and k.split("/")[0] in promised))
    lines = [line for line in err.splitlines() if line.strip()]
    outcome = classify(case, code, out, err, lines, changed, baselines)
    return {"index": case["index"], "class": case["class"], "argv": argv_of(case),
            "damage": case.get("damage"), "outcome": outcome, "exit": code,
            "stderr": lines[-1][:200] if lines else "", "changed": changed[:5],
            "seconds": round(time.time() - started, 2)}


def classify(case, code, out, err, lines, changed, baselines) -> str:
    if code is None:
        return "hang"
    if code < 0:
        return "signal"
    if "Traceback (most recent call last)" in err:
        return "traceback"
    if changed:
        return "left-files"
    if code == 0:
        if case["expect"] == "refuse":
            return "wrong-exit-0"
        expected = baselines.get((case["template"], case["art"]))
        return ("ok" if expected is None or normal(out, case["template"]) == expected
                else "wrong-exit-0")
    if code == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        return "refused"
    return "bad-refusal"


def normal(stdout: str, template: str) -> str:
    """What must not change: the text generated, the evaluation, and what inspect says the
    graph takes and returns (its manifest legitimately carries the damaged file's hash)."""
    if template != "inspect":
        return stdout
    try:
        return json.dumps(json.loads(stdout)["io"], sort_keys=True)
    except (json.JSONDecodeError, KeyError, TypeError):
        return stdout


def baselines_of(sources: dict, payload: dict, cache: str) -> dict:
    """The undamaged output of each command whose output is compared, by (template, art)."""
    baselines = {}
    for template, art in [("generate", "onnx"), ("generate", "xnnpack"), ("inspect", "onnx"),
                          ("inspect", "xnnpack"), ("generate-pt", "onnx"), ("eval", "onnx")]:
        case = {"art": art, "template": template}
        with tempfile.TemporaryDirectory() as tmp:
            setup(case, Path(tmp), sources, payload)
            done = subprocess.run([sys.executable, "-m", "psa_edge.cli", *argv_of(case)],
                                  cwd=tmp, capture_output=True, text=True,
                                  env=environment(cache))
        if done.returncode:
            raise RuntimeError(f"the undamaged {template} on {art} failed:\n{done.stderr}")
        baselines[(template, art)] = normal(done.stdout, template)
    return baselines


def campaign(n: int, seed: int, jobs: int, sources: dict, progress=None) -> list[dict]:
    """`n` cases of `seed` on `sources` ({"checkpoint", "onnx", "xnnpack": paths}), `jobs` at
    a time; `progress(result)` after each."""
    import torch

    rng = random.Random(seed)
    cases = [make_case(rng, i) for i in range(n)]
    payload = torch.load(sources["checkpoint"], weights_only=True)
    with tempfile.TemporaryDirectory(prefix="psa-edge-fuzz-cache-") as cache:
        hf = Path(cache) / "hf"
        subprocess.run([sys.executable, "-m", "psa_edge.cli", "export-hf", sources["checkpoint"],
                        "-o", hf], check=True, capture_output=True, env=environment(cache))
        (Path(cache) / "state").mkdir()
        subprocess.run([sys.executable, "-m", "psa_edge.cli", *TRAIN, "--state-every", "1",
                        "-o", Path(cache) / "state" / "m.pt"], check=True, capture_output=True,
                       env=environment(cache))
        sources = {**sources, "hf": hf, "state": Path(cache) / "state" / "m.state.pt"}
        baselines = baselines_of(sources, payload, cache)
        with ThreadPoolExecutor(jobs) as pool:
            results = []
            for result in pool.map(lambda c: run(c, sources, payload, baselines, cache), cases):
                results.append(result)
                if progress is not None:
                    progress(result)
    return results


