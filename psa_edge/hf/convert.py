"""Hugging Face layouts in and out: `import-hf`, `export-hf`, and the config files ONNX clients
read (docs/reference/spec.md §8).

Contract:
- `import_hf(folder, output, variant, gamma)`: a transformers `LlamaForCausalLM` folder
  (config.json, model.safetensors or its shards with model.safetensors.index.json,
  tokenizer.json) becomes a psa-edge checkpoint with the chosen shear (by default the folder's
  own: none for a Llama model, its gammas for a psa-edge export). The weights are read with
  safetensors (never unpickled); what the PSA model does not implement is refused with one line
  (another architecture, attention or MLP biases, RoPE scaling, an activation other than SiLU,
  a head size other than hidden / heads), as are a missing, corrupt or truncated file and a
  tokenizer that does not parse. Nothing is written then.
- `export_hf(checkpoint, folder)`: the `save_pretrained` layout: config.json, model.safetensors,
  generation_config.json, tokenizer.json and tokenizer_config.json. A gamma = 0 model is a plain
  `LlamaForCausalLM` (no remote code); a sheared one carries `modeling_psa.py`, registered
  through `auto_map`, which transformers loads with `trust_remote_code=True`.
- `llama_config`, `generation_config`, `genai_config`: the JSON files both of these and the ONNX
  export folder write, for transformers / optimum and for onnxruntime-genai.
"""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

from psa_edge.contract import MODEL_FILES
from psa_edge.errors import CheckpointError, ConfigError, PsaEdgeError
from psa_edge.io import (HF_EXPORT_FOLDER, atomic_directory, check_hf_output, check_output,
                         manifest_path, refuse_overlap, sha256_file, write_json)

REMOTE_CODE = Path(__file__).with_name("modeling_psa.py")
LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "rms_norm_eps", "rope_theta", "tie_word_embeddings", "bos_token_id",
                "eos_token_id")


def transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def llama_config(cfg, remote_code: bool = True, dtype: str = "float32") -> dict:
    """config.json of a model config (`ModelConfig`): a Llama config, plus the shear and, with
    `remote_code` (an export-hf folder, which carries modeling_psa.py), the remote code that
    implements it. An ONNX folder holds no torch code to point at: its config stays a
    `llama` one that optimum reads, with the shear's fields beside it."""
    config = {**cfg.to_llama_dict(), "architectures": ["LlamaForCausalLM"],
              "model_type": "llama", "torch_dtype": dtype, "use_cache": True,
              "rope_scaling": None, "attention_dropout": 0.0, "initializer_range": 0.02,
              "pretraining_tp": 1, "transformers_version": transformers_version()}
    if (cfg.gamma_q or cfg.gamma_k) and not remote_code:
        config.update(gamma_q=cfg.gamma_q, gamma_k=cfg.gamma_k, psa_variant=cfg.variant)
    elif cfg.gamma_q or cfg.gamma_k:
        config.update(architectures=["PSAForCausalLM"], model_type="psa_llama",
                      gamma_q=cfg.gamma_q, gamma_k=cfg.gamma_k, psa_variant=cfg.variant,
                      auto_map={"AutoConfig": "modeling_psa.PSAConfig",
                                "AutoModelForCausalLM": "modeling_psa.PSAForCausalLM"},
                      use_cache=not cfg.gamma_q)  # queries are not cached
    return config


def generation_config(cfg) -> dict:
    return {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
            "do_sample": False, "max_length": cfg.max_position_embeddings,
            "transformers_version": transformers_version()}


def genai_config(cfg, max_len: int, inputs: dict, filename: str = MODEL_FILES["onnx"]
                 ) -> dict:
    """onnxruntime-genai's genai_config.json for an ONNX graph it feeds `inputs`
    (`GraphForm.genai_inputs`)."""
    # A vocabulary without an end-of-text token stops on no id: onnxruntime-genai 0.18 takes
    # an empty list, and refuses an id outside [0, vocab) (it refused vocab_size, the id
    # psa-edge once wrote). The pad id only fills batch rows: any in-range id.
    eos = cfg.eos_token_id
    return {"model": {
        "type": "llama", "bos_token_id": cfg.bos_token_id or 0,
        "eos_token_id": [] if eos is None else eos, "pad_token_id": eos or 0,
        "vocab_size": cfg.vocab_size, "context_length": max_len,
        "decoder": {"filename": filename, "session_options": {"log_id": "psa-edge",
                                                              "provider_options": []},
                    "head_size": cfg.head_dim, "hidden_size": cfg.hidden_size,
                    "num_attention_heads": cfg.num_attention_heads,
                    "num_key_value_heads": cfg.num_key_value_heads,
                    "num_hidden_layers": cfg.num_hidden_layers,
                    "inputs": inputs,
                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "max_length": max_len, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False,
                   "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                   "early_stopping": True, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
                   "diversity_penalty": 0.0}}


def read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent} has no {path.name} ({what})")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({str(exc)[:100]})")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return data


# What check_llama and import_hf read before ModelConfig checks the rest: name -> JSON type.
TYPED_FIELDS = {"model_type": "a string", "architectures": "a list", "rope_scaling": "an object",
                "hidden_act": "a string", "hidden_size": "an integer",
                "num_attention_heads": "an integer", "head_dim": "an integer",
                "gamma_k": "a number", "gamma_q": "a number", "psa_variant": "a string"}
JSON_TYPES = {"a string": (str,), "a list": (list,), "an object": (dict,),
              "an integer": (int,), "a number": (int, float)}


def check_types(config: dict, path: Path) -> None:
    """Refuse a field of the wrong JSON type (a bool is not a number here), so that no check
    computes with it."""
    for key, kind in TYPED_FIELDS.items():
        value = config.get(key)
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, JSON_TYPES[kind])):
            raise ConfigError(f"{path}: {key} = {value!r} is not {kind}")


def check_llama(config: dict, path: Path) -> None:
    """Refuse what the PSA model does not implement."""
    check_types(config, path)
    archs = config.get("architectures") or []
    known = {"llama": ["LlamaForCausalLM"], "psa_llama": ["PSAForCausalLM"]}
    if archs not in (known.get(config.get("model_type")), []):
        raise ConfigError(f"{path}: {archs or config.get('model_type')} is not a "
                          f"LlamaForCausalLM; psa-edge imports Llama models only")
    unsupported = [(k, config.get(k)) for k in ("attention_bias", "mlp_bias") if config.get(k)]
    if (config.get("rope_scaling") or {}).get("rope_type", "default") != "default":
        unsupported.append(("rope_scaling", config["rope_scaling"]))
    if config.get("hidden_act", "silu") != "silu":
        unsupported.append(("hidden_act", config["hidden_act"]))
    heads = config.get("num_attention_heads") or 1
    if config.get("head_dim") not in (None, (config.get("hidden_size") or 0) // heads):
        unsupported.append(("head_dim", config["head_dim"]))
    if unsupported:
        name, value = unsupported[0]
        raise ConfigError(f"{path}: {name} = {value!r} is not implemented by psa-edge's model")


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files that hold a folder's weights: model.safetensors, or the shards its
    index names; refused when one is missing (checked before torch is imported)."""
    index = folder / "model.safetensors.index.json"
    names = (shard_names(read_json(index, "the shard index"), index) if index.exists()
             else ["model.safetensors"])
    for name in names:
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder} has no {name} (the weights, as safetensors)")
    return [folder / name for name in names]


def shard_names(index: dict, path: Path) -> list[str]:
    """The shard files a model.safetensors.index.json names: plain file names in its folder."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path} has no weight_map (tensor name -> shard file)")
    names = sorted(set(map(str, weight_map.values())))
    for name in names:
        if Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{path} names a shard outside its folder: {name!r}")
    return names


def read_safetensors(paths: list[Path]) -> dict:
    """Every tensor of the safetensors files `paths`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    tensors = {}
    for path in paths:
        try:
            tensors.update(load_file(str(path)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file "
                                  f"({str(exc)[:120]})")
    return tensors


def import_hf(source: Path, output: Path, variant: str | None = None,
              gamma: float | None = None) -> dict:
    """`source`: a save_pretrained folder or a llama.cpp GGUF file (`hf/gguf.py`)."""
    from psa_edge.hf.gguf import is_gguf, read_gguf
    from psa_edge.model.config import ModelConfig, gammas_for
    from psa_edge.tokenizer import Tokenizer

    source, output = Path(source), Path(output)
    gguf = source.is_file() and is_gguf(source)
    if not gguf and not source.is_dir():
        raise CheckpointError(f"{source} is neither a folder (a save_pretrained layout) nor a "
                              f"GGUF file")
    check_output(output)
    files = [source] if gguf else [p for p in source.iterdir() if p.is_file()]
    refuse_overlap([output, manifest_path(output)], files)
    if gguf:
        model_file = read_gguf(source)
        config, where, chat = model_file.config, source, model_file.chat
        tokenizer = Tokenizer(model_file.tokenizer, chat["chat_template"])
    else:
        where, chat = source / "config.json", {}
        config = read_json(where, "the model's config")
        check_llama(config, where)
        tokenizer = Tokenizer.from_file(source / "tokenizer.json")
    if variant is None:  # the source's own shear (a psa-edge export), else none
        variant = config.get("psa_variant", "baseline")
        gamma = gamma if gamma is not None else config.get("gamma_k") or config.get("gamma_q")
    gamma_q, gamma_k = gammas_for(variant, gamma)
    try:
        cfg = ModelConfig(**{k: config[k] for k in LLAMA_FIELDS if k in config},
                          gamma_q=gamma_q, gamma_k=gamma_k, variant=variant)
    except (TypeError, PsaEdgeError) as exc:
        raise ConfigError(f"{where}: {exc}")
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model "
                          f"{cfg.vocab_size}")
    weights = None if gguf else weight_files(source)
    import torch  # after every check of the source, so that a bad one is refused at once

    from psa_edge.model.checkpoint import save_checkpoint
    from psa_edge.model.transformer import PSATransformer

    tensors = ({k: torch.from_numpy(v) for k, v in model_file.weights().items()} if gguf
               else read_safetensors(weights))
    if cfg.tie_word_embeddings:
        tensors.setdefault("lm_head.weight", tensors.get("model.embed_tokens.weight"))
    model = PSATransformer(cfg)
    try:
        model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()
                               if not k.endswith("rotary_emb.inv_freq")}, strict=True)
    except (RuntimeError, AttributeError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise CheckpointError(f"{source}: the weights do not match its config "
                              f"({' '.join(lines[:2])[:160]})")
    model.tokenizer = tokenizer
    return save_checkpoint(output, model, {
        "task": None, "imported": {"folder": str(source), "config": config, "chat": chat,
                                   "files": {p.name: sha256_file(p) for p in sorted(files)}}})


def export_hf(checkpoint: Path, folder: Path) -> Path:
    from safetensors.torch import save

    from psa_edge.model.checkpoint import model_of, read_checkpoint, tokenizer_of

    check_hf_output(folder)
    refuse_overlap([folder], [checkpoint, manifest_path(checkpoint)])
    payload = read_checkpoint(checkpoint)
    model = model_of(payload, checkpoint)
    cfg = model.cfg
    # The checkpoint's own weight dtype (float16 / bfloat16 round-trip through the float32
    # model exactly): a 4.85 MB float16 checkpoint stays 4.85 MB, not 9.45 MB of float32.
    dtype = payload["state_dict"]["model.embed_tokens.weight"].dtype
    state = {k: v.to(dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:  # one storage: safetensors stores it once, under its own name
        state.pop("lm_head.weight")
    with atomic_directory(folder, replaceable=HF_EXPORT_FOLDER) as tmp:
        # To bytes first: a full disk is then an OSError, which the atomic folder reports.
        (tmp / "model.safetensors").write_bytes(save(state, metadata={"format": "pt"}))
        write_json(tmp / "config.json", llama_config(cfg, dtype=str(dtype).split(".")[-1]))
        write_json(tmp / "generation_config.json", generation_config(cfg))
        tokenizer_of(model).write(tmp, cfg.max_position_embeddings)
        if cfg.gamma_q or cfg.gamma_k:
            shutil.copyfile(REMOTE_CODE, tmp / "modeling_psa.py")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        write_json(tmp / "manifest.json", {"kind": "hf-export", "checkpoint": str(checkpoint),
                                           "sha256": sha256_file(checkpoint), "files": files})
    return Path(folder)
