"""The fused ONNX form: the decoder written directly as an ONNX Runtime graph of fused contrib ops
with static, in-place KV caches (docs/reference/spec.md §4). Built from the model's weights with
`onnx.helper`, not traced: torch.onnx has no spelling for ONNX Runtime's fused operators.

Contract (`build(model, max_len, form) -> ModelProto`, names and shapes from `contract.GraphIO`):
- inputs `input_ids [1, S]` int64, `input_pos [1]` int64 (the position P of the first token),
  `logits_to_keep [1]` int64 (R: the logits of the last R rows only; 0 for all S),
  per layer i `past_key_values.{i}.key / .value` `[1, Hkv, max_len, dh]` (static) and the slots
  `past_key_values.{i}.prev_key [1, 1, Hkv dh]` (`.prev_query [1, 1, H dh]`) where that gamma
  is non-zero: the raw post-RoPE key (query) of position P - 1, zeros at P = 0;
- outputs `logits [1, R, V]` (`[1, S, V]` at R = 0 or R >= S), `present.{i}.key / .value`
  (the same static shape: a runtime binds each to its past buffer, and GroupQueryAttention then
  writes the chunk's rows in place), and per sheared stream and layer `present.{i}.raw_key
  [1, S, Hkv dh]` (`.raw_query`): the chunk's raw streams, whose last row is the next slot.
- Per layer: SkipSimplifiedLayerNormalization (the residual add and RMSNorm in one op), one
  MatMul for q, k and v together, RotaryEmbedding (rotate-half) on q and k, the shear as
  Sub, Mul, Add after RoPE (the shifted stream is Concat(slot, x)[:S]), GroupQueryAttention
  (no rotary inside; causal over the first P + S rows of the cache), the output MatMul, the
  SwiGLU MLP with gate and up in one MatMul. Then the final norm, a Slice of the rows whose
  logits are asked for, and the output projection. The weight MatMuls are what `quantize`
  replaces.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from psa_edge.contract import GraphIO

OPSET = 23  # RMSNormalization
MS = "com.microsoft"


class GraphWriter:
    """Nodes and initializers of one graph, each output named after its node."""

    def __init__(self):
        self.nodes, self.initializers, self.count = [], [], 0

    def const(self, name: str, value) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1,
           domain: str = "", **attrs) -> list[str]:
        self.count += 1
        name = f"{op_type}_{self.count}"
        names = [f"{name}_out{i}" for i in range(outputs)] if isinstance(outputs, int) \
            else outputs
        self.nodes.append(helper.make_node(op_type, inputs, names, name=name, domain=domain,
                                           **attrs))
        return names


def weights_of(model) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def rope_tables(cfg, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin `[max_len, dh / 2]` of the Hugging Face Llama RoPE (ops.rope_cos_sin's halves)."""
    dh = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
    angles = np.arange(max_len, dtype=np.float32)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def shear(g: GraphWriter, stream: str, slot: str, seq: str, gamma: float) -> str:
    """`x + gamma (x - shifted x)` along S, the shifted stream's first row being the slot."""
    (shifted_all,) = g.op("Concat", [slot, stream], axis=1)
    (shifted,) = g.op("Slice", [shifted_all, "zero_1d", seq, "one_1d"])
    (delta,) = g.op("Sub", [stream, shifted])
    (scaled,) = g.op("Mul", [delta, g.const(f"gamma_{g.count}", np.float32(gamma))])
    return g.op("Add", [stream, scaled])[0]


def attention(g: GraphWriter, w: dict, cfg, i: int, normed: str) -> str:
    prefix, h, hkv, dh = f"model.layers.{i}.self_attn.", cfg.num_attention_heads, \
        cfg.num_key_value_heads, cfg.head_dim
    qkv_weight = np.concatenate([w[prefix + f"{p}_proj.weight"] for p in "qkv"]).T
    (qkv,) = g.op("MatMul", [normed, g.const(f"{prefix}qkv_proj.weight_t", qkv_weight)])
    query, key, value = g.op("Split", [qkv, g.const(f"split_qkv_{i}", np.array(
        [h * dh, hkv * dh, hkv * dh], np.int64))], 3, axis=-1)
    raw, sheared = {}, {}
    for stream, x, heads, gamma in (("query", query, h, cfg.gamma_q), ("key", key, hkv,
                                                                     cfg.gamma_k)):
        # a sheared stream's raw post-RoPE rows are also a graph output (the next slots)
        (raw[stream],) = g.op("RotaryEmbedding", [x, "input_pos", "cos_cache", "sin_cache"],
                              [f"present.{i}.raw_{stream}"] if gamma else 1, domain=MS,
                              interleaved=0, num_heads=heads)
        sheared[stream] = raw[stream] if gamma == 0 else shear(
            g, raw[stream], f"past_key_values.{i}.prev_{stream}", "seq_len_1d", gamma)
    (attended, _, _) = g.op(
        "GroupQueryAttention",
        [sheared["query"], sheared["key"], value, f"past_key_values.{i}.key",
         f"past_key_values.{i}.value", "seqlens_k", "total_len"],
        [f"attended_{i}", f"present.{i}.key", f"present.{i}.value"], domain=MS, num_heads=h,
        kv_num_heads=hkv, do_rotary=0)
    weight = w[prefix + "o_proj.weight"].T
    return g.op("MatMul", [attended, g.const(f"{prefix}o_proj.weight_t", weight)])[0]


def mlp(g: GraphWriter, w: dict, cfg, i: int, normed: str) -> str:
    prefix = f"model.layers.{i}.mlp."
    gate_up_weight = np.concatenate([w[prefix + "gate_proj.weight"],
                                     w[prefix + "up_proj.weight"]]).T
    (gate_up,) = g.op("MatMul", [normed, g.const(f"{prefix}gate_up_proj.weight_t",
                                                 gate_up_weight)])
    gate, up = g.op("Split", [gate_up, g.const(f"split_mlp_{i}", np.array(
        [cfg.intermediate_size] * 2, np.int64))], 2, axis=-1)
    (sigmoid,) = g.op("Sigmoid", [gate])
    (silu,) = g.op("Mul", [gate, sigmoid])
    (hidden,) = g.op("Mul", [silu, up])
    return g.op("MatMul", [hidden, g.const(f"{prefix}down_proj.weight_t",
                                           w[prefix + "down_proj.weight"].T)])[0]


def positions(g: GraphWriter) -> None:
    """seq_len_1d (S), seqlens_k (P + S - 1, int32 [1]) and total_len (P + S, int32 scalar)."""
    (shape,) = g.op("Shape", ["input_ids"])
    g.op("Slice", [shape, "one_1d", g.const("two_1d", np.array([2], np.int64))],
         ["seq_len_1d"])
    (total,) = g.op("Add", ["input_pos", "seq_len_1d"])
    (total32,) = g.op("Cast", [total], to=TensorProto.INT32)
    (last,) = g.op("Sub", [total32, g.const("one_i32", np.array([1], np.int32))])
    g.op("Identity", [last], ["seqlens_k"])
    g.op("Squeeze", [total32, "zero_1d"], ["total_len"])


def logit_rows(g: GraphWriter) -> tuple[str, str]:
    """Slice bounds of the rows whose logits are computed: the last `logits_to_keep` (0: from
    row 0, so all; past S, Slice clamps to all). A prefill needs only its last row; the output
    projection of the others is 35% of psa-4m's weight arithmetic (docs/results/benchmarks.md)."""
    (start,) = g.op("Neg", ["logits_to_keep"])
    return start, g.const("end_1d", np.array([np.iinfo(np.int64).max], np.int64))


def norm(g: GraphWriter, x: str, residual: str | None, weight: np.ndarray, name: str,
         eps: float) -> tuple[str, str]:
    """(RMSNorm(x + residual), x + residual); the first layer's input has no residual."""
    if residual is None:
        (out,) = g.op("RMSNormalization", [x, g.const(name, weight)], axis=-1, epsilon=eps)
        return out, x
    out, _, _, total = g.op("SkipSimplifiedLayerNormalization",
                            [x, residual, g.const(name, weight)], 4, domain=MS, epsilon=eps)
    return out, total


def build(model, max_len: int, form: str) -> onnx.ModelProto:
    cfg = model.cfg
    io = GraphIO.from_config(cfg.to_dict(), max_len, form)
    w = weights_of(model)
    g = GraphWriter()
    g.const("zero_1d", np.array([0], np.int64))
    g.const("one_1d", np.array([1], np.int64))
    cos, sin = rope_tables(cfg, max_len)
    g.const("cos_cache", cos)
    g.const("sin_cache", sin)
    positions(g)
    (x,) = g.op("Gather", [g.const("model.embed_tokens.weight",
                                   w["model.embed_tokens.weight"]), "input_ids"])
    residual = None
    for i in range(cfg.num_hidden_layers):
        layer = f"model.layers.{i}."
        normed, residual = norm(g, x, residual, w[layer + "input_layernorm.weight"],
                                layer + "input_layernorm.weight", cfg.rms_norm_eps)
        x = attention(g, w, cfg, i, normed)
        normed, residual = norm(g, x, residual, w[layer + "post_attention_layernorm.weight"],
                                layer + "post_attention_layernorm.weight", cfg.rms_norm_eps)
        x = mlp(g, w, cfg, i, normed)
    normed, _ = norm(g, x, residual, w["model.norm.weight"], "model.norm.weight",
                     cfg.rms_norm_eps)
    (kept,) = g.op("Slice", [normed, *logit_rows(g), "one_1d"])
    lm_head = w.get("lm_head.weight", w["model.embed_tokens.weight"]).T
    g.op("MatMul", [kept, g.const("lm_head.weight_t", np.ascontiguousarray(lm_head))],
         ["logits"])
    inputs = [helper.make_tensor_value_info(name, dtype, shape)
              for name, dtype, shape in io.typed_inputs()]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
               for name, shape in io.typed_outputs()]
    graph = helper.make_graph(g.nodes, "psa_edge_fused", inputs, outputs, g.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid(MS, 1)],
                             producer_name="psa-edge")
