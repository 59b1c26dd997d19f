"""The incremental-decoding runtime (docs/reference/spec.md §3, §5) on real backends (ONNX Runtime,
ExecuTorch), float: prefix reuse, rollback (state compared, slots included), speculative decoding
(greedy equality, the sampling rule's distribution), cache parity, `verify`, bad input."""

import math

import numpy as np
import pytest
import torch

from conftest import CASES, cli, copy_artifact, make_model, manifest_of
from psa_edge.checks.reference import Reference
from psa_edge.checks.verify import STAGES, verify
from psa_edge.errors import ArtifactError, SequenceError
from psa_edge.model.checkpoint import load_checkpoint
from psa_edge.model.transformer import twin_of
from psa_edge.runtime import speculative
from psa_edge.runtime.generate import Sampling, distribution, generate
from psa_edge.runtime.session import Session, open_session
from psa_edge.runtime.speculative import (PromptLookupDrafter, SessionDrafter, ShiftedDrafter,
                                          speculative_generate)

BACKENDS = ["onnx", "xnnpack", "runner", "fused", "raw-key"]
TOL = 1e-4


def reference(checkpoints, name, tokens):
    variant, _, twin, _ = CASES[name]
    model, _ = load_checkpoint(checkpoints[variant])
    model = twin_of(model) if twin else model
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(tokens, np.int64))[None])[0].numpy()


def scale_tol(logits):
    return TOL * max(1.0, float(np.abs(logits).max()))


@pytest.mark.parametrize("name", BACKENDS)
def test_prefix_state_restored_for_several_continuations(artifacts, checkpoints, name):
    session = open_session(artifacts[name])
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 64, size=20)
    session.feed(prefix[:7])
    session.feed(prefix[7:])
    saved = session.snapshot()
    for _ in range(3):
        continuation = rng.integers(0, 64, size=9)
        session.restore(saved)
        reused = np.concatenate([session.feed(continuation[:4]), session.feed(continuation[4:])])
        fresh = open_session(artifacts[name])
        recomputed = fresh.feed(np.concatenate([prefix, continuation]))[20:]
        expected = reference(checkpoints, name, np.concatenate([prefix, continuation]))[20:]
        assert np.abs(reused - recomputed).max() <= scale_tol(expected)
        assert np.abs(reused - expected).max() <= scale_tol(expected)


@pytest.mark.parametrize("name", ["onnx", "xnnpack", "raw-key"])
@pytest.mark.parametrize("kept", [0, 2, 5])
def test_rollback_equals_a_sequence_that_never_saw_the_rejected_tokens(artifacts, name, kept):
    """State compared, not only logits: caches and both slots (the model is symmetric; the
    raw-key form's key-only model has the caches alone, and its rollback is a truncation)."""
    session = open_session(artifacts[name])
    rng = np.random.default_rng(kept)
    prefix, proposed = rng.integers(0, 64, size=11), rng.integers(0, 64, size=5)
    session.feed(prefix)
    session.feed(proposed)
    session.rollback(11 + kept)
    clean = open_session(artifacts[name])
    clean.feed(np.concatenate([prefix, proposed[:kept]]))
    assert set(session.state) == set(clean.state)
    fields = {"key", "value"} | ({"prev_key", "prev_query"} if name != "raw-key" else set())
    assert {k.split(".")[1] for k in session.state} == fields
    for key, value in clean.state.items():
        assert session.state[key].shape == value.shape
        assert np.abs(session.state[key] - value).max() <= 1e-5, key
    assert session.tokens == clean.tokens
    assert np.abs(session.last_logits - clean.last_logits).max() <= 1e-4
    follow = rng.integers(0, 64, size=3)
    assert np.abs(session.feed(follow) - clean.feed(follow)).max() <= 1e-4


def test_runner_form_rolls_back_and_restores_within_its_window(artifacts, checkpoints):
    """The runner form's state stays in the program: a rollback moves the position back, and
    the program takes the slot from its raw-key window; a restore is refused once the
    program's cache no longer holds the snapshot."""
    session, clean = open_session(artifacts["runner"]), open_session(artifacts["onnx"])
    tokens = np.random.default_rng(3).integers(0, 64, size=40)
    expected = Reference.of_checkpoint(checkpoints["key-only"]).logits(tokens)
    session.feed(tokens[:20])
    saved = session.snapshot()
    session.feed(tokens[::-1][:7])  # rejected proposals
    session.rollback(20)
    assert np.abs(session.feed(tokens[20:30]) - expected[20:30]).max() < 1e-4 * 30
    session.restore(saved)
    assert np.abs(session.feed(tokens[20:]) - expected[20:]).max() < 1e-4 * 30
    session.reset()
    session.feed(tokens[::-1][:30])  # another sequence overwrites the cache rows
    with pytest.raises(SequenceError, match="no longer holds"):
        session.restore(saved)
    del clean


@pytest.mark.parametrize("kept", [0, 2, 5])
def test_fused_form_rolls_back_in_place(artifacts, kept):
    """The fused form's caches stay in the program: a rollback moves the position back and
    sets the slots from the kept raw keys (and queries), over one-token chunks too; the next
    calls equal a session that never saw the rejected tokens."""
    session, clean = open_session(artifacts["fused"]), open_session(artifacts["fused"])
    rng = np.random.default_rng(kept)
    prefix, proposed = rng.integers(0, 64, size=11), rng.integers(0, 64, size=5)
    session.feed(prefix[:8])
    for t in prefix[8:]:
        session.feed([t])
    session.feed(proposed)
    session.rollback(11 + kept)
    clean.feed(np.concatenate([prefix, proposed[:kept]]))
    assert session.tokens == clean.tokens
    assert np.abs(session.last_logits - clean.last_logits).max() <= 1e-5
    for key, value in clean.slots().items():
        assert np.abs(session.slots()[key] - value).max() <= 1e-5, key
    follow = rng.integers(0, 64, size=3)
    assert np.abs(session.feed(follow[:1]) - clean.feed(follow[:1])).max() <= 1e-5
    assert np.abs(session.feed(follow[1:]) - clean.feed(follow[1:])).max() <= 1e-5


def test_fused_form_writes_its_static_caches_in_place(artifacts, checkpoints):
    """GroupQueryAttention writes each chunk's sheared keys into the program's own arrays at
    their positions (nothing past them), and the logits are the reference's."""
    import onnx

    graph = onnx.load(str(artifacts["fused"] / "model.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("GroupQueryAttention") == 2 and ops.count("RotaryEmbedding") == 4
    assert ops.count("Sub") == 2 * 2 + 1  # two sheared streams per layer, and the positions
    session = open_session(artifacts["fused"])
    tokens = np.random.default_rng(4).integers(0, 64, size=13)
    logits = np.concatenate([session.feed(tokens[:9])] + [session.feed([t]) for t in tokens[9:]])
    expected = reference(checkpoints, "fused", tokens)
    assert np.abs(logits - expected).max() <= scale_tol(expected)
    for name, cache in session.program.caches.items():
        assert cache.shape == (1, 2, 48, 16), name
        assert np.abs(cache[:, :, :13]).sum(-1).all(), name  # every row written
        assert not cache[:, :, 13:].any(), name
    reference_session = Reference.of_checkpoint(checkpoints["symmetric"]).session(48)
    reference_session.feed(tokens)
    assert np.abs(session.program.caches["1.key"][:, :, :13]
                  - reference_session.state["1.key"]).max() <= 1e-4


@pytest.mark.parametrize("name", BACKENDS)
def test_last_only_feed_gives_the_last_positions_logits(artifacts, checkpoints, name):
    """A prefill's `feed(last_only=True)`: the last position's logits `[1, V]`, the reference's;
    the state after it is the same (the next chunk's logits are the reference's). A rollback
    into that chunk leaves `last_logits` None in the fused form, whose graph computed no other
    row; the other forms computed and kept them."""
    tokens = np.random.default_rng(5).integers(0, 64, size=16)
    expected = reference(checkpoints, name, tokens)
    session = open_session(artifacts[name])
    last = session.feed(tokens[:12], last_only=True)
    assert last.shape == (1, 64)
    assert np.abs(last[0] - expected[11]).max() <= scale_tol(expected)
    assert np.abs(session.last_logits - expected[11]).max() <= scale_tol(expected)
    assert np.abs(session.feed(tokens[12:]) - expected[12:]).max() <= scale_tol(expected)
    session.rollback(6)
    if name == "fused":
        assert session.last_logits is None
    else:
        assert np.abs(session.last_logits - expected[5]).max() <= scale_tol(expected)
    assert np.abs(session.feed(tokens[6:]) - expected[6:]).max() <= scale_tol(expected)


def test_fused_graph_keeps_the_logits_of_the_last_rows_asked(artifacts):
    """The fused graph's `logits_to_keep` input, as Hugging Face's: the last R rows, all of
    them at 0 or past S."""
    import onnxruntime as ort

    session = open_session(artifacts["fused"])
    graph = ort.InferenceSession(str(artifacts["fused"] / "model.onnx"),
                                 providers=["CPUExecutionProvider"])
    tokens = np.random.default_rng(6).integers(0, 64, size=(1, 7))
    all_rows = session.feed(tokens[0])
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in graph.get_inputs()}
    feeds.update(input_ids=tokens, input_pos=np.array([0]))
    for keep, rows in ((0, 7), (1, 1), (3, 3), (7, 7), (50, 7)):
        logits = graph.run(["logits"], {**feeds, "logits_to_keep": np.array([keep])})[0][0]
        assert logits.shape == (rows, 64)
        assert np.abs(logits - all_rows[7 - rows:]).max() <= 1e-5


def test_rollback_reaches_back_over_single_token_chunks(artifacts):
    """What a draft session needs: several one-token calls, then back to an earlier point."""
    session, clean = open_session(artifacts["onnx"]), open_session(artifacts["onnx"])
    tokens = np.arange(30) % 64
    session.feed(tokens[:20])
    for t in tokens[20:26]:
        session.feed([t])
    assert session.rollback_floor <= 18
    session.rollback(22)
    clean.feed(tokens[:22])
    for key, value in clean.state.items():
        assert np.abs(session.state[key] - value).max() <= 1e-5, key
    with pytest.raises(SequenceError, match="use a snapshot"):
        session.rollback(session.rollback_floor - 1)


@pytest.mark.parametrize("name", BACKENDS)
def test_greedy_speculative_equals_target_greedy(artifacts, name):
    target = open_session(artifacts[name])
    prompt = np.random.default_rng(2).integers(0, 64, size=12)
    plain = generate(target, prompt, 24)
    drafters = {"agreeing": SessionDrafter(open_session(artifacts[name]), 64),
                "never agreeing": ShiftedDrafter(SessionDrafter(open_session(artifacts[name]), 64),
                                                 64),
                "prompt lookup": PromptLookupDrafter(),
                "other model": SessionDrafter(open_session(artifacts["onnx-twin"]), 64)}
    for label, drafter in drafters.items():
        result = speculative_generate(target, drafter, prompt, 24, draft_len=3)
        assert result.tokens == plain.tokens, label
        stats = result.stats
        assert stats["tokens_per_target_call"] == 24 / stats["target_calls"]
        if label == "agreeing":
            assert stats["acceptance_rate"] == 1.0 and stats["tokens_per_target_call"] > 3
        if label == "never agreeing":
            assert stats["accepted"] == 0 and stats["target_calls"] == 24


def test_a_draft_shorter_than_the_target_proposes_what_fits(artifacts, checkpoints):
    target = open_session(artifacts["onnx"])
    draft = SessionDrafter(Reference.of_checkpoint(checkpoints["symmetric"]).session(20), 64)
    prompt = np.random.default_rng(5).integers(0, 64, size=12)
    result = speculative_generate(target, draft, prompt, 30, draft_len=4)
    assert result.tokens == generate(target, prompt, 30).tokens
    assert 0 < result.stats["drafted"] < 4 * result.stats["target_calls"]


def test_fused_cache_bytes_equal_the_twins_at_max(artifacts):
    """Static caches: the max-length bytes from the first token on, the twin's exactly."""
    psa, twin = open_session(artifacts["fused"]), open_session(artifacts["fused-twin"])
    for length in (1, 48):
        psa.reset()
        psa.feed(np.arange(length) % 64)
        a, b = psa.sizes(), twin.sizes()
        assert a["kv_cache_bytes"] == b["kv_cache_bytes"] == 2 * 2 * 2 * 48 * 16 * 4
        assert sum(c.nbytes for c in psa.program.caches.values()) == a["kv_cache_bytes"]
        assert a["extra_bytes"] == 2 * (2 + 4) * 16 * 4 and b["extra_bytes"] == 0


def test_cache_bytes_equal_the_twins(artifacts):
    for psa_name, twin_name in (("onnx", "onnx-twin"), ("xnnpack", "xnnpack-twin")):
        psa, twin = open_session(artifacts[psa_name]), open_session(artifacts[twin_name])
        for length in (1, 9, 48):
            psa.reset()
            twin.reset()
            psa.feed(np.arange(length) % 64)
            twin.feed(np.arange(length) % 64)
            a, b = psa.sizes(), twin.sizes()
            assert a["kv_cache_bytes"] == b["kv_cache_bytes"] == 2 * 2 * 2 * length * 16 * 4
            assert a["kv_cache_bytes_at_max"] == b["kv_cache_bytes_at_max"]
            # prev_key [1, 2, 1, 16] + prev_query [1, 4, 1, 16] per layer, fp32, any length
            assert a["extra_bytes"] == 2 * (2 + 4) * 16 * 4 and b["extra_bytes"] == 0


# --------------------------------------------------------------------------- sampling rule

ALPHA = 1e-3  # false-alarm rate of the goodness-of-fit test (a correct sampler fails 1 in 1000)


def chi2_sf(x: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty), accurate to a few per
    cent of the p-value for dof >= 3, which is all a threshold at 1e-3 needs."""
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def goodness_of_fit(counts: dict, expected_probs: dict, n: int) -> float:
    """p-value of Pearson's test, cells with fewer than 5 expected pooled into one."""
    big = {k for k, p in expected_probs.items() if p * n >= 5}
    observed = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    expected = [expected_probs[k] * n for k in big] + [n * (1 - sum(expected_probs[k]
                                                                    for k in big))]
    pairs = [(o, e) for o, e in zip(observed, expected) if e > 0]
    stat = sum((o - e) ** 2 / e for o, e in pairs)
    return chi2_sf(stat, len(pairs) - 1)


@pytest.fixture(scope="session")
def small_vocab(tmp_path_factory):
    """A target and a different draft model over a 6-token vocabulary, exported to ONNX."""
    from psa_edge.export.pipeline import ExportRequest, run_export
    from psa_edge.model.checkpoint import save_checkpoint

    root, out = tmp_path_factory.mktemp("vocab6"), {}
    for name, seed in (("target", 0), ("draft", 1)):
        model = make_model("key-only", seed=seed, vocab_size=6)
        with torch.no_grad():  # back to moderate logits: the distributions must be spread
            model.lm_head.weight.mul_(0.05)
        save_checkpoint(root / f"{name}.pt", model, {})
        out[name] = root / name
        run_export(ExportRequest(root / f"{name}.pt", "onnx", out[name], 16))
        out[f"{name}_model"] = model
    return out


def exact_pairs(model, prompt, sampling) -> dict:
    """The target's exact distribution over the next two tokens."""
    with torch.no_grad():
        first = distribution(model(torch.tensor([prompt]))[0, -1].numpy(), sampling)
        probs = {}
        for a in range(6):
            second = distribution(model(torch.tensor([prompt + [a]]))[0, -1].numpy(), sampling)
            probs.update({(a, b): first[a] * second[b] for b in range(6)})
    return probs


def sampled_pairs(small_vocab, sampling, runs, drafter_factory) -> dict:
    target = open_session(small_vocab["target"])
    drafter = drafter_factory()
    counts = {}
    for seed in range(runs):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        result = speculative_generate(target, drafter, [1, 4, 2], 2, draft_len=2, sampling=s)
        key = tuple(result.tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_speculative_sampling_has_the_targets_distribution(small_vocab, monkeypatch):
    sampling, runs = Sampling(temperature=1.0), 2000
    probs = exact_pairs(small_vocab["target_model"], [1, 4, 2], sampling)
    draft = lambda: SessionDrafter(open_session(small_vocab["draft"]), 6)  # noqa: E731
    counts = sampled_pairs(small_vocab, sampling, runs, draft)
    p_value = goodness_of_fit(counts, probs, runs)
    assert p_value > ALPHA, p_value
    # The same test rejects a wrong rule (always accept the draft): it has the power to fail.
    monkeypatch.setattr(speculative, "accept", lambda logits, drafts, dists, s, rng: (
        len(drafts), int(np.argmax(logits[len(drafts)]))))
    wrong = sampled_pairs(small_vocab, sampling, runs, draft)
    assert goodness_of_fit(wrong, probs, runs) < ALPHA


def test_plain_sampling_with_top_k_and_top_p_has_the_targets_distribution(small_vocab):
    sampling, runs = Sampling(temperature=0.8, top_k=4, top_p=0.9), 1500
    probs = exact_pairs(small_vocab["target_model"], [1, 4, 2], sampling)
    target, counts = open_session(small_vocab["target"]), {}
    for seed in range(runs):
        s = Sampling(sampling.temperature, sampling.top_k, sampling.top_p, seed)
        key = tuple(generate(target, [1, 4, 2], 2, s).tokens)
        counts[key] = counts.get(key, 0) + 1
    assert all(probs[k] > 0 for k in counts)  # nothing outside top-k / top-p
    assert goodness_of_fit(counts, probs, runs) > ALPHA


# --------------------------------------------------------------------------- verify

@pytest.mark.parametrize("name", ["onnx", "xnnpack", "portable", "runner", "fused", "raw-key"])
def test_verify_passes_on_float_artifacts(artifacts, checkpoints, name):
    variant = CASES[name][0]
    twin = {"onnx": "onnx-twin", "runner": "runner-twin", "fused": "fused-twin"}.get(name)
    twin = artifacts[twin] if twin else None
    stages = []
    report = verify(artifacts[name], checkpoints[variant], twin, started=stages.append)
    failed = [c for c in report["checks"] if not c["passed"]]
    assert report["passed"], failed
    assert [row["ratio"] for row in report["cache"]] == [1.0] * len(report["cache"])
    assert stages == list(STAGES)  # each began in order (the CLI's bar)


def test_verify_catches_a_rollback_that_leaves_the_slot(artifacts, checkpoints, monkeypatch):
    rollback = Session.rollback

    def keep_slot(self, length):  # cut the caches but leave the previous-key slot as it was
        slots = {k: v for k, v in self.state.items() if "prev_" in k}
        rollback(self, length)
        self.state.update(slots)

    monkeypatch.setattr(Session, "rollback", keep_slot)
    report = verify(artifacts["onnx"], checkpoints["symmetric"])
    checks = {c["name"]: c for c in report["checks"]}
    assert not report["passed"] and not checks["3. rollback"]["passed"]


def test_verify_and_generate_cli(artifacts, checkpoints):
    result = cli("verify", artifacts["onnx"], "--reference", checkpoints["symmetric"], "--twin",
                 artifacts["onnx-twin"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: every check" in result.stdout and "cache parity" in result.stdout
    import json

    for name in ("onnx", "runner"):  # either form, speculative on the runner form too
        result = cli("generate", artifacts[name], "--prompt", "ABCDABC", "-n", "6",
                     "--prompt-lookup", "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert len(report["tokens"]) == 6 and report["speculative"] == "prompt-lookup"


# --------------------------------------------------------------------------- bad input

def recorded_arrays(artifact) -> dict:
    with np.load(artifact / "reference.npz") as data:
        return dict(data)


@pytest.mark.parametrize("damage,message", [
    (lambda path, a: path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2]),
     "is not a readable recorded reference"),
    (lambda path, a: np.savez(path, **{k: v for k, v in a.items() if k != "logits"}),
     "is not a readable recorded reference"),
    (lambda path, a: np.savez(path, **{**a, "logits": np.array([object()] * 3)}),
     "is not a readable recorded reference"),
    (lambda path, a: np.savez(path, **{**a, "logits": a["logits"][:, :-1]}),
     "does not hold the logits of a"),
    (lambda path, a: np.savez(path, **{**a, "logits": np.full_like(a["logits"], np.nan)}),
     "does not hold the logits of a"),
    (lambda path, a: np.savez(path, **{**a, "tokens": a["tokens"].astype(np.float32)}),
     "does not hold the logits of a"),
])
def test_a_damaged_recorded_reference_is_refused(artifacts, tmp_path, damage, message):
    """verify on a device reads reference.npz; a damaged one was a traceback (BadZipFile, a
    broadcasting error), found by damaging the artifact's side files."""
    from psa_edge.checks.verify import RecordedReference

    path = tmp_path / "reference.npz"
    with open(path, "wb") as f:
        f.write((artifacts["onnx"] / "reference.npz").read_bytes())
    damage(path, recorded_arrays(artifacts["onnx"]))
    vocab = manifest_of(artifacts["onnx"])["config"]["vocab_size"]
    with pytest.raises(ArtifactError, match=message):
        RecordedReference(path, vocab)
    RecordedReference(artifacts["onnx"] / "reference.npz", vocab)  # the undamaged one reads


def test_bad_input_leaves_the_session_usable(artifacts, small_vocab):
    session = open_session(artifacts["onnx"])
    tokens = np.arange(10) % 64
    session.feed(tokens)
    before = {k: v.copy() for k, v in session.state.items()}
    with pytest.raises(SequenceError, match="outside the vocabulary"):
        session.feed([3, 64])
    for token in (64, -1):  # one token: the decode step's own check
        with pytest.raises(SequenceError, match=f"token id {token} is outside the vocabulary"):
            session.feed([token])
    with pytest.raises(SequenceError, match="must be integers"):
        session.feed([2.0])
    with pytest.raises(SequenceError, match="max length"):
        session.feed(np.zeros(40, np.int64))
    with pytest.raises(SequenceError, match="max length"):
        generate(session, tokens, 45)
    other = open_session(artifacts["onnx-twin"])
    with pytest.raises(ArtifactError, match="another artifact"):
        session.restore(other.snapshot())
    with pytest.raises(ArtifactError, match="vocabulary"):
        SessionDrafter(open_session(small_vocab["target"]), 64)
    assert all(np.array_equal(before[k], v) for k, v in session.state.items())
    fresh = open_session(artifacts["onnx"])
    fresh.feed(tokens)
    assert np.array_equal(session.feed([5, 6]), fresh.feed([5, 6]))


def test_artifact_of_another_graph_io_is_refused(artifacts):
    """An artifact whose manifest lists other I/O than its config implies (per-layer raw
    outputs, the I/O of an older psa-edge) gets one line saying to export it again."""
    from psa_edge.contract import GraphIO

    manifest = manifest_of(artifacts["onnx"])
    io = manifest["io"]
    io["outputs"] = [name for name in io["outputs"] if not name.startswith("present.raw_")] + [
        f"present.{i}.{f}" for i in range(2) for f in ("raw_key", "raw_query")]
    with pytest.raises(ArtifactError, match="export it again"):
        GraphIO.from_manifest(manifest)


@pytest.mark.parametrize("args,message", [
    (["--prompt-ids", "1,2,99"], "outside the vocabulary"),
    (["--prompt", "AB", "-n", "47"], "max length"),
    (["--prompt", "AB", "--draft", "DRAFT6"], "vocabulary"),
    (["--prompt", "AB", "--prompt-ids", "1"], "exactly one"),
    (["--prompt", ""], "the prompt is empty"),
])
def test_generate_bad_input(artifacts, small_vocab, args, message):
    args = [str(small_vocab["target"]) if a == "DRAFT6" else a for a in args]
    result = cli("generate", artifacts["onnx"], *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_executorch_native_log_stays_off_the_terminal(artifacts, tmp_path):
    """ExecuTorch logs natively while it loads a program (cpuinfo probes on x86, the threadpool
    size); that log stays off stderr, and when a program cannot load, its last line names the
    reason in the one-line error."""
    import json

    from psa_edge.io import sha256_file

    truncated = copy_artifact(artifacts["xnnpack"], tmp_path / "truncated")
    data = (truncated / "model.pte").read_bytes()
    (truncated / "model.pte").write_bytes(data[:len(data) // 2])
    manifest = manifest_of(truncated)
    # only ExecuTorch can tell
    manifest["files"]["model.pte"] = sha256_file(truncated / "model.pte")
    (truncated / "manifest.json").write_text(json.dumps(manifest))
    result = cli("generate", truncated, "--prompt", "AB", "-n", "2", "--threads", "1")
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "ExecuTorch cannot load" in result.stderr and "file size" in result.stderr.lower()
    result = cli("generate", artifacts["xnnpack"], "--prompt", "AB", "-n", "2", "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "cpuinfo" not in result.stderr and "threadpool" not in result.stderr, result.stderr


def test_threads_size_the_executorch_threadpool(artifacts):
    from psa_edge.backends.executorch import set_threads

    before = set_threads(None)
    try:
        open_session(artifacts["xnnpack"], threads=1)
        assert set_threads(None) == 1
        open_session(artifacts["xnnpack"], threads=2)
        assert set_threads(None) == 2
    finally:
        set_threads(before)


def test_bench_profile_splits_a_prefills_and_a_decoded_tokens_time(artifacts):
    """`bench --profile` on ONNX Runtime, both graph forms: per prefill and per decoded token,
    the kernel time per operator fits inside the run and the run inside the wall time, and
    every node runs once per feed; a .pte is refused."""
    import json

    for name, fused_ops in (("fused", {"GroupQueryAttention", "RotaryEmbedding"}),
                            ("onnx", set())):
        result = cli("bench", artifacts[name], "--profile", "-p", "8", "-n", "16", "-r", "3",
                     "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        prefill = report["prefill"]
        assert (prefill["tokens"], prefill["repetitions"], report["decode_tokens"]) == (8, 3, 16)
        for item, times in (("token", report), ("prefill", prefill)):
            kernels = times[f"kernel_us_per_{item}"]
            assert {"Sub", "Mul"} | fused_ops <= set(kernels)  # the shear's, at least
            assert 0 < sum(kernels.values()) <= times[f"ort_run_us_per_{item}"] \
                <= times[f"wall_us_per_{item}"]
            assert times[f"nodes_per_{item}"] == report["nodes_per_token"] > 10
    result = cli("bench", artifacts["xnnpack"], "--profile", "-p", "8", "-n", "8")
    assert result.returncode == 2 and "ONNX Runtime's profiler" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
