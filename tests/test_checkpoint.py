"""Checkpoint format (docs/reference/spec.md §8): round trip, weights_only, refusal of foreign or
hostile files."""

import os

import pytest
import torch

from conftest import make_model
from psa_edge.errors import CheckpointError, ConfigError
from psa_edge.io import manifest_path, sha256_file
from psa_edge.model.checkpoint import FORMAT_TAG, load_checkpoint, read_checkpoint, save_checkpoint


def test_round_trip_and_manifest(tmp_path):
    model = make_model("symmetric", gamma=0.5)
    path = tmp_path / "m.pt"
    save_checkpoint(path, model, {"note": "x"})
    loaded, meta = load_checkpoint(path)
    assert loaded.cfg == model.cfg and meta == {"note": "x"}
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    import json
    manifest = json.loads(manifest_path(path).read_text())
    assert manifest["artifact_sha256"] == sha256_file(path)
    assert manifest["variant"] == "symmetric" and manifest["gamma_q"] == 0.5
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_malicious_pickle_is_refused_not_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT_TAG, "payload": Exploit()}, path)
    with pytest.raises(CheckpointError, match="not a readable psa-edge checkpoint"):
        read_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("content,match", [
    (b"", "not a readable"), (b"garbage bytes", "not a readable"),
])
def test_corrupt_files(tmp_path, content, match):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=match):
        read_checkpoint(path)


def test_wrong_tag_version_and_missing(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"format": "safetensors?", "version": 1}, path)
    with pytest.raises(CheckpointError, match="format tag"):
        read_checkpoint(path)
    torch.save({"format": FORMAT_TAG, "version": 99}, path)
    with pytest.raises(CheckpointError, match="version 99"):
        read_checkpoint(path)
    torch.save([1, 2], path)
    with pytest.raises(CheckpointError, match="format tag"):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.pt")


def test_weights_that_do_not_match_config(tmp_path):
    model = make_model()
    path = tmp_path / "m.pt"
    save_checkpoint(path, model, {})
    payload = torch.load(path, weights_only=True)
    payload["config"]["hidden_size"] = 128
    payload["config"]["intermediate_size"] = 64
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="do not match"):
        load_checkpoint(path)
    payload["config"]["variant"] = "warp-drive"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="invalid config"):
        load_checkpoint(path)


def test_a_config_that_claims_tied_embeddings_it_does_not_have(tmp_path):
    """Found by the fuzz campaign: the config said tied, lm_head differed, and the load
    silently replaced the embedding with lm_head."""
    path = tmp_path / "m.pt"
    save_checkpoint(path, make_model(), {})
    payload = torch.load(path, weights_only=True)
    payload["config"]["tie_word_embeddings"] = True
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="ties the embeddings"):
        load_checkpoint(path)


@pytest.mark.parametrize("params,message", [
    ({"seq_len": {}}, "seq_len = {} is not an integer"),
    ({"seq_len": 16, "alphabet": 2**63}, "alphabet = 9223372036854775808 is not an integer"),
])
def test_eval_refuses_a_recorded_task_with_junk_parameters(tmp_path, params, message):
    """A checkpoint's recorded task parameters reach get_task; junk there was a TypeError."""
    from conftest import cli

    path = tmp_path / "m.pt"
    save_checkpoint(path, make_model(), {"task": {"name": "ih-sht", "params": params}})
    result = cli("eval", path, "--samples", "4")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_storage(tmp_path, dtype):
    """Weights stored in half precision: the file is about half, tied weights are written once,
    and the loaded float32 model holds exactly the rounded weights."""
    from psa_edge.model.transformer import PSATransformer

    model = PSATransformer(make_model().cfg.replace(tie_word_embeddings=True))
    full, half = tmp_path / "full.pt", tmp_path / "half.pt"
    save_checkpoint(full, model, {})
    save_checkpoint(half, model, {}, weights_dtype=dtype)
    weights = sum(v.numel() for k, v in model.state_dict().items() if k != "lm_head.weight")
    assert os.path.getsize(full) - os.path.getsize(half) > 0.9 * 2 * weights
    loaded, _ = load_checkpoint(half)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert b.dtype == torch.float32
        assert torch.equal(a.to(getattr(torch, dtype)).float(), b), name
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    import json
    assert json.loads(manifest_path(half).read_text())["weights_dtype"] == dtype


def test_a_weight_that_overflows_float16_is_refused(tmp_path):
    model = make_model()
    with torch.no_grad():
        model.model.norm.weight[0] = 1e6
    with pytest.raises(ConfigError, match="does not fit in float16"):
        save_checkpoint(tmp_path / "m.pt", model, {}, weights_dtype="float16")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", True, "hidden_size must be an integer, got True"),
    ("hidden_size", 1, r"hidden_size = 1 is outside \[2, "),
    ("rope_theta", "1e4", r"rope_theta must be a number in \[0, 1e\+12\], got '1e4'"),
    ("gamma_k", float("nan"), r"gamma_k must be a number in \[0, 100\], got nan"),
    ("gamma_q", False, "gamma_q must be a number"),
    ("rms_norm_eps", 0.0, "rms_norm_eps and rope_theta must be positive"),
    ("eos_token_id", 64, "eos_token_id = 64 is not a token id of the vocabulary"),
    ("bos_token_id", True, "bos_token_id = True is not a token id"),
    ("bos_token_id", 1.0, "bos_token_id = 1.0 is not a token id"),
])
def test_a_config_of_junk_values_is_refused_by_field(field, value, message):
    from psa_edge.contract import check_config

    config = make_model().cfg.to_dict()
    check_config(config)
    config["eos_token_id"] = config["vocab_size"] - 1  # the last token id is one
    check_config(config)
    with pytest.raises(ConfigError, match=message):
        check_config(config | {field: value})
