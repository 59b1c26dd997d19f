"""docs/results/benchmarks.md's llama.cpp block: psa-edge's PSA model against llama.cpp running its
gamma = 0 twin, same presets, precisions and thread counts, the two taking turns.

    .venv/bin/python tools/llama_cpp_bench.py --presets psa-4m psa-30m psa-92m --threads 1 2

llama.cpp is built once from the source inside the llama-cpp-python package (cmake; cached in
~/.cache/psa-edge/llama.cpp, outside the repository). The twin's weights are written as an F32
GGUF with the `gguf` package (q/k rows permuted from the rotate-half to llama.cpp's interleaved
RoPE, as its own converter does) and quantized by llama-quantize --pure to Q8_0 and Q4_0 (every
matrix, lm_head and embedding included). Per round, llama-bench (-p, -n, -r) and `psa-edge
bench` (-p, -n, -r) run alternately on every build; the table reports the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from common import OUT, artifact, bench_checkpoint, commit, machine, psa_edge_json, write_block

from psa_edge.io import write_json
from psa_edge.model import PRESETS

LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp is built
CACHE = Path.home() / ".cache" / "psa-edge" / "llama.cpp"
FOLDER = OUT / "llama-cpp"
# psa-edge precision -> (llama.cpp type, psa-edge builds: column -> target, --quantize, --form):
# ONNX Runtime's fused form, the explicit-state forms, and XNNPACK's runner form (static caches
# in the program, written and read by ExecuTorch's llama kernels).
PRECISIONS = {
    "fp32": ("F32", {"onnx-fused": ("onnx", None, "fused"),
                     "onnx": ("onnx", None, "explicit-state"),
                     "xnnpack": ("xnnpack", None, "explicit-state"),
                     "xnnpack-runner": ("xnnpack", None, "runner")}),
    "int8": ("Q8_0", {"onnx-fused": ("onnx", "int8-dynamic", "fused"),
                      "onnx-fused-block": ("onnx", "int8-block", "fused"),
                      "onnx": ("onnx", "int8-dynamic", "explicit-state"),
                      "xnnpack": ("xnnpack", "int8-dynamic", "explicit-state"),
                      "xnnpack-runner": ("xnnpack", "int8-dynamic", "runner")}),
    "int4": ("Q4_0", {"onnx-fused": ("onnx", "int4", "fused"),
                      "onnx": ("onnx", "int4", "explicit-state"),
                      "xnnpack": ("xnnpack", "int4", "explicit-state"),
                      "xnnpack-runner": ("xnnpack", "int4", "runner")})}
COLUMNS = {"onnx-fused": "ONNX Runtime, fused form", "onnx-fused-block": "the same, int8-block",
           "onnx": "ONNX Runtime, explicit-state", "xnnpack": "ExecuTorch XNNPACK, explicit-state",
           "xnnpack-runner": "ExecuTorch XNNPACK, runner form"}


def build_llama_cpp() -> Path:
    """The folder of llama-bench and llama-quantize, built once."""
    binaries = CACHE / "build" / "bin"
    if (binaries / "llama-bench").exists() and (binaries / "llama-quantize").exists():
        return binaries
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", CACHE], check=True)
    with tarfile.open(CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as sdist:
        sdist.extractall(CACHE, filter="data")
    source = CACHE / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    subprocess.run(["cmake", "-S", source, "-B", CACHE / "build", "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF"], check=True)
    subprocess.run(["cmake", "--build", CACHE / "build", "-j", "--target", "llama-bench",
                    "llama-quantize"], check=True)
    return binaries


def interleaved_rope_rows(weight, heads: int):
    """q/k projection rows reordered so llama.cpp's pairwise RoPE computes HF's rotate-half."""
    out, dim = weight.shape
    return weight.reshape(heads, 2, out // heads // 2, dim).swapaxes(1, 2).reshape(out, dim)


def write_gguf(checkpoint: Path, path: Path) -> None:
    """The checkpoint's twin (its weights with gamma 0) as an F32 llama GGUF. The vocabulary is
    placeholder strings: llama-bench feeds token ids and never tokenizes."""
    import gguf

    from psa_edge.model.checkpoint import load_checkpoint

    model, _ = load_checkpoint(checkpoint)
    cfg, weights = model.cfg, {k: v.float().numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, cfg.vocab_size)])
    writer.add_token_scores([0.0] * cfg.vocab_size)
    writer.add_token_types([gguf.TokenType.NORMAL] * cfg.vocab_size)
    writer.add_add_bos_token(False)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        for ours, theirs in names.items():
            w = weights[f"model.layers.{i}.{ours}.weight"]
            if theirs in ("attn_q", "attn_k"):
                w = interleaved_rope_rows(w, cfg.num_attention_heads if theirs == "attn_q"
                                          else cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{i}.{theirs}.weight", w)
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights.get("lm_head.weight",
                                                   weights["model.embed_tokens.weight"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_builds(preset: str, binaries: Path) -> dict[str, Path]:
    """F32, Q8_0 and Q4_0 GGUFs of the preset's twin (Q4_0 from the checkpoint whose weights
    are on the 4-bit grid, as psa-edge's int4 builds: `common.bench_checkpoint`)."""
    builds = {}
    for kind, grid in (("F32", ""), ("Q8_0", ""), ("Q4_0", "-q4grid")):
        f32 = FOLDER / f"{preset}{grid}-twin-F32.gguf"
        if not f32.exists():
            write_gguf(bench_checkpoint(preset, "q4_0" if grid else None), f32)
        builds[kind] = FOLDER / f"{preset}{grid}-twin-{kind}.gguf"
        if not builds[kind].exists():
            subprocess.run([binaries / "llama-quantize", "--pure", f32, builds[kind], kind],
                           check=True, capture_output=True)
    return builds


def llama_bench(binaries: Path, gguf_path: Path, threads: int, args) -> dict:
    """llama-bench's tokens/s: "pp" (when args.p) and "tg"."""
    out = subprocess.run([binaries / "llama-bench", "-m", gguf_path, "-p", str(args.p), "-n",
                          str(args.n), "-r", str(args.r), "-t", str(threads), "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    tests = json.loads(out)
    rate = {("pp" if t["n_prompt"] else "tg"): t["avg_ts"] for t in tests}
    return {**rate, "build": f"{tests[0]['build_commit']} ({tests[0]['build_number']})",
            "cpu": tests[0].get("cpu_info")}


def psa_edge_bench(artifact: Path, threads: int, args) -> dict:
    report = psa_edge_json("bench", artifact, "-p", args.p, "-n", args.n, "-r", args.r,
                           "--threads", threads)
    result = report["results"][0]
    return {"pp": result[f"pp{args.p}"]["tokens_per_second"],
            "tg": result[f"tg{args.n}"]["tokens_per_second"], "rss": report["peak_rss_bytes"]}


def measure(args) -> list[dict]:
    binaries = build_llama_cpp()
    FOLDER.mkdir(parents=True, exist_ok=True)
    cases = []
    for preset in args.presets:
        ggufs = gguf_builds(preset, binaries)
        for precision, (kind, builds) in ((p, PRECISIONS[p]) for p in args.precisions):
            ours = {column: artifact(preset, target, quant, False, form)
                    for column, (target, quant, form) in builds.items()}
            for threads in args.threads:
                cases.append({"preset": preset, "precision": precision, "kind": kind,
                              "threads": threads, "gguf": ggufs[kind], "ours": ours})
    rounds = []
    for round_ in range(args.rounds):
        for case in cases:
            row = {"llama.cpp": llama_bench(binaries, case["gguf"], case["threads"], args)}
            for name, build in case["ours"].items():
                row[name] = psa_edge_bench(build, case["threads"], args)
            rounds.append({k: v for k, v in case.items() if k not in ("gguf", "ours")}
                          | row | {"machine": machine(), "commit": commit()})
            print(json.dumps(rounds[-1], default=str), flush=True)
    return rounds


def runs_of(rounds: list[dict], preset: str, precision: str, threads: int) -> list[dict]:
    return [r for r in rounds if (r["preset"], r["precision"], r["threads"])
            == (preset, precision, threads)]


def cases_of(rounds: list[dict]) -> list[tuple[str, str, int]]:
    """The (preset, precision, threads) the rounds hold, in preset and precision order."""
    return sorted({(r["preset"], r["precision"], r["threads"]) for r in rounds},
                  key=lambda k: (list(PRESETS).index(k[0]), list(PRECISIONS).index(k[1]), k[2]))


def medians(runs: list[dict], test: str) -> dict[str, float]:
    """Each build's median tokens/s over the rounds of one case: llama.cpp and psa-edge's
    columns."""
    return {name: statistics.median(r[name][test] for r in runs)
            for name in runs[0] if isinstance(runs[0][name], dict)}


def table(rounds: list[dict], args) -> str:
    """Tokens/s per preset, precision, thread count and test (median over rounds), each build's
    column, the best psa-edge build over llama.cpp's, and the peak RSS of the bench processes
    (max length 512: each backend's static-cache form against its explicit-state form)."""
    lines = ["| preset | precision | threads | test | llama.cpp (twin) | "
             + " | ".join(f"{c} (PSA)" for c in COLUMNS.values())
             + " | best / llama.cpp | peak RSS MB fused / explicit | the same, XNNPACK runner "
             "/ explicit |", "|" + "---|" * (len(COLUMNS) + 8)]
    for preset, precision, threads in cases_of(rounds):
        runs = runs_of(rounds, preset, precision, threads)
        for test in ("pp", "tg"):
            med = medians(runs, test)
            ours = {c: med[c] for c in COLUMNS if c in med}
            cells = " | ".join(f"{ours[c]:.0f}" if c in ours else "-" for c in COLUMNS)
            rss = [" / ".join(f"{min(r[c]['rss'] for r in runs) / 1e6:.0f}" if c in runs[0]
                              else "-" for c in pair)
                   for pair in (("onnx-fused", "onnx"), ("xnnpack-runner", "xnnpack"))]
            lines.append(f"| {preset} | {precision} / {runs[0]['kind']} | {threads} | "
                         f"{test}{args.p if test == 'pp' else args.n} | "
                         f"{med['llama.cpp']:.0f} | {cells} | "
                         f"**{max(ours.values()) / med['llama.cpp']:.2f}** | {' | '.join(rss)} |")
    return "\n".join(lines)


# The decode goal: psa-edge's fastest build at least llama.cpp's, psa-4m's at least this share.
DECODE_BAR = {"psa-4m": 0.8}


def ratios(rounds: list[dict]) -> dict[tuple, dict[str, float]]:
    """(preset, precision, threads, test) -> each psa-edge column's median tokens/s over
    llama.cpp's."""
    out = {}
    for case in cases_of(rounds):
        for test in ("pp", "tg"):
            med = medians(runs_of(rounds, *case), test)
            out[case + (test,)] = {c: med[c] / med["llama.cpp"] for c in COLUMNS if c in med}
    return out


def row_name(preset: str, precision: str, threads: int) -> str:
    return f"{preset} {precision} {threads} thread{'s' * (threads > 1)}"


def goal_lines(ratio: dict[tuple, dict[str, float]]) -> list[str]:
    """The rows short of the goal: decode at least llama.cpp's (psa-4m at least DECODE_BAR of
    it) and prefill at least llama.cpp's, on psa-edge's fastest build of the row."""
    lines = []
    shares = "; ".join(f"{preset}: at least {share} of it" for preset, share in DECODE_BAR.items())
    for test, goal in (("tg", f"Decode at least llama.cpp's ({shares})"),
                       ("pp", "Prefill at least llama.cpp's")):
        rows = {key[:3]: max(r.values()) for key, r in ratio.items() if key[3] == test}
        bar = {key: DECODE_BAR.get(key[0], 1.0) if test == "tg" else 1.0 for key in rows}
        short = [f"{row_name(*key)} {best:.2f}" for key, best in rows.items() if best < bar[key]]
        lines.append(f"{goal}: {len(rows) - len(short)} of {len(rows)} rows"
                     + (f"; short of it: {', '.join(short)}." if short else "."))
    return lines


def fastest_line(ratio: dict[tuple, dict[str, float]]) -> str:
    """How many decode rows each build is psa-edge's fastest in, and how many at 1 thread."""
    fastest = {key: max(r, key=r.get) for key, r in ratio.items() if key[3] == "tg"}
    counts = []
    for column in COLUMNS:
        rows = [key for key, c in fastest.items() if c == column]
        if rows:
            alone = sum(key[2] == 1 for key in rows)
            counts.append(f"{COLUMNS[column]} in {len(rows)} ({alone} at 1 thread)")
    ones = sum(key[2] == 1 for key in fastest)
    return (f"psa-edge's fastest decode, of {len(fastest)} rows ({ones} at 1 thread): "
            + "; ".join(counts) + ".")


def int4_prefill_line(ratio: dict[tuple, dict[str, float]]) -> str | None:
    """int4 prefill over llama.cpp's Q4_0 on the presets above psa-4m, each build's range."""
    keys = [key for key in ratio if key[1] == "int4" and key[3] == "pp" and key[0] != "psa-4m"]
    if not keys:
        return None
    spans = []
    for column in COLUMNS:
        values = [ratio[key][column] for key in keys if column in ratio[key]]
        if values:
            low, high = f"{min(values):.2f}", f"{max(values):.2f}"
            spans.append(f"{COLUMNS[column]} {low if low == high else f'{low}-{high}'}x")
    presets = sorted({key[0] for key in keys}, key=list(PRESETS).index)
    return f"int4 prefill over llama.cpp's Q4_0, {' and '.join(presets)}: {'; '.join(spans)}."


def second_thread_line(rounds: list[dict]) -> str | None:
    """int4 decode at 2 threads over 1 thread, per preset: llama.cpp, ONNX Runtime's fused
    form and XNNPACK's runner form."""
    parts = []
    for preset in sorted({r["preset"] for r in rounds}, key=list(PRESETS).index):
        one, two = (runs_of(rounds, preset, "int4", t) for t in (1, 2))
        if not (one and two):
            continue
        rate_one, rate_two = medians(one, "tg"), medians(two, "tg")
        gain = {name: rate_two[name] / rate_one[name]
                for name in ("llama.cpp", "onnx-fused", "xnnpack-runner")}
        parts.append(f"{preset} {gain['llama.cpp']:.2f}x / {gain['onnx-fused']:.2f}x / "
                     f"{gain['xnnpack-runner']:.2f}x")
    if not parts:
        return None
    return ("int4 decode at 2 threads over 1 thread, llama.cpp / ONNX Runtime's fused form / "
            "XNNPACK's runner form: " + "; ".join(parts) + ".")


def findings(rounds: list[dict]) -> str:
    """The block's findings, computed from its rows, as a list."""
    ratio = ratios(rounds)
    lines = goal_lines(ratio) + [fastest_line(ratio), int4_prefill_line(ratio),
                                 second_thread_line(rounds)]
    return "\n".join(f"- {line}" for line in lines if line)


# the operators of a weight matrix product (int8-dynamic: the activations' quantization too)
LINEAR_OPS = ("MatMul", "MatMulNBits", "DynamicQuantizeMatMul", "MatMulInteger",
              "DynamicQuantizeLinear")


def profile_key(preset: str, precision: str) -> str:
    return f"{preset} {precision}"


def one_thread_cases(rounds: list[dict]) -> list[tuple[str, str]]:
    """The (preset, precision) the rounds hold at 1 thread: the cases with a decode profile."""
    return [(preset, precision) for preset, precision, threads in cases_of(rounds)
            if threads == 1]


def measure_profiles(rounds: list[dict], stored: dict, args) -> dict:
    """The stored profiles, with `psa-edge bench --profile` of the fused form at 1 thread run
    for each 1-thread case of the rounds that has none."""
    profiles = dict(stored)
    for preset, precision in one_thread_cases(rounds):
        if profile_key(preset, precision) in profiles:
            continue
        target, quant, form = PRECISIONS[precision][1]["onnx-fused"]
        report = psa_edge_json("bench", artifact(preset, target, quant, False, form),
                               "--profile", "-p", args.p, "-n", args.n, "--threads", 1)
        profiles[profile_key(preset, precision)] = {
            key: report[key] for key in ("wall_us_per_token", "kernel_us_per_token",
                                         "outside_ort_us_per_token")} | {"commit": commit()}
    return profiles


def profile_table(rounds: list[dict], profiles: dict) -> str:
    """Where a fused-form token's time goes at 1 thread (`psa-edge bench --profile`, whose
    profiler adds its own cost to every node), beside llama.cpp's whole token."""
    lines = ["| preset | precision | llama.cpp token | psa-edge token (fused form): unprofiled "
             "/ profiled | weight MatMuls | GroupQueryAttention | other operators | outside "
             "ONNX Runtime |", "|" + "---|" * 8]
    for preset, precision in one_thread_cases(rounds):
        report = profiles[profile_key(preset, precision)]
        ops = report["kernel_us_per_token"]
        weights = sum(ops.get(op, 0) for op in LINEAR_OPS)
        attention = ops.get("GroupQueryAttention", 0)
        runs = runs_of(rounds, preset, precision, 1)
        llama, ours = (statistics.median(1e6 / r[name]["tg"] for r in runs)
                       for name in ("llama.cpp", "onnx-fused"))
        lines.append(f"| {preset} | {precision} / {PRECISIONS[precision][0]} | {llama:.0f} | "
                     f"{ours:.0f} / {report['wall_us_per_token']:.0f} | {weights:.0f} | "
                     f"{attention:.0f} | {sum(ops.values()) - weights - attention:.0f} | "
                     f"{report['outside_ort_us_per_token']:.0f} |")
    return "\n".join(lines)


def page(rounds: list[dict], profiles: dict, args) -> str:
    """The block: how it was measured, its findings, the table and the decode profile."""
    first = rounds[0]["llama.cpp"]
    measured_rounds = min(len(runs_of(rounds, *case)) for case in cases_of(rounds))
    commits = sorted({r.get("commit", "not recorded") for r in rounds})
    profiled_at = ", ".join(sorted({report["commit"] for report in profiles.values()}))
    return (f"{rounds[0].get('machine', machine())}, psa-edge at commit {', '.join(commits)}; "
            f"llama.cpp {first['build']} from llama-cpp-python {LLAMA_CPP_PYTHON}'s source, "
            f"built with cmake (Release, native). Tokens/s, median of {measured_rounds} "
            f"round{'s' * (measured_rounds > 1)} of llama-bench and `psa-edge bench` taking "
            f"turns, each -p {args.p} -n {args.n} -r {args.r}; random weights, PSA key-only 0.8 "
            f"against llama.cpp's GGUF of its twin. Peak RSS: the bench process's VmHWM (its "
            f"smallest over rounds): ONNX Runtime's fused / explicit-state form, and ExecuTorch "
            f"XNNPACK's runner / explicit-state form (processes that also hold torch, which "
            f"ExecuTorch's Python runtime imports), all at max length 512. Computed from the "
            f"table:\n\n" + findings(rounds) + "\n\n"
            + table(rounds, args) + "\n\nWhere a decoded token's time goes, 1 thread, "
            f"-p {args.p} -n {args.n} (microseconds per token; the operator columns are "
            f"ONNX Runtime's profile, whose own cost per node inflates the small operators "
            f"most, `psa-edge bench --profile`"
            + (f", at commit {profiled_at}" if profiled_at else "") + "):\n\n"
            + profile_table(rounds, profiles) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["psa-4m", "psa-30m", "psa-92m"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("-p", type=int, default=128)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", nargs="+", choices=list(PRECISIONS),
                        default=list(PRECISIONS), help="measure these, keep the others' results")
    parser.add_argument("--render", action="store_true",
                        help="the page from the last results (profiling only cases not yet "
                        "profiled)")
    args = parser.parse_args()
    results, profiled = FOLDER / "results.json", FOLDER / "profiles.json"
    rounds = json.loads(results.read_text()) if results.exists() else []
    profiles = json.loads(profiled.read_text()) if profiled.exists() else {}
    if not args.render:
        kept = [r for r in rounds if r["precision"] not in args.precisions
                or r["preset"] not in args.presets]
        others = {r.get("machine", "a machine not recorded") for r in kept} - {machine()}
        if others:  # rows of two machines in one table would compare nothing
            raise SystemExit(f"{results} holds rows measured on {', '.join(others)}, not on "
                             f"{machine()}: measure every preset and precision here, or remove it")
        rounds = kept + measure(args)
        write_json(results, rounds)
        kept_keys = {profile_key(r["preset"], r["precision"]) for r in kept}
        profiles = {key: report for key, report in profiles.items() if key in kept_keys}
    profiles = measure_profiles(rounds, profiles, args)
    write_json(profiled, profiles)
    block = page(rounds, profiles, args)
    write_block("llama-cpp", block, "docs/results/benchmarks.md")
    print(block)


if __name__ == "__main__":
    main()
