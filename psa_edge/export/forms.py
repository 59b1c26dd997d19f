"""The torch half of each graph form: modules over `PSATransformer.decode`, and the export
objects the pipeline asks for them (docs/reference/spec.md §2, §4). A form (`contract.GraphForm`,
in the registry) names its export class here; the pipeline builds it as `Class(form_name)`, so a
registered form may reuse a class below under its own name and tensor names.

Both modules run the model's one layer loop, so every exporter lowers the same arithmetic (the
shear is `ops.shear`: Sub, Mul, Add after the RoPE ops); they differ only in where each layer's
state lives (`LayerCache`). Names and shapes come from `contract.GraphIO`.

- `ExplicitStateModule`: `(input_ids [1, S], *past) -> (logits, *present, *raw)`; the start
  position is the past length P. ExecuTorch programs carry it twice, sharing the weights: method
  `forward` (S dynamic) and method `decode` (S = 1, where the shear's shift needs no op).
- `RunnerModule`: `forward(tokens [1, S], input_pos [1]) -> logits` with static max-length
  caches (written and attended by ExecuTorch's llama kernels, which read only the rows written
  so far) and, per sheared stream, a ring of the raw keys (queries) of the last `window`
  positions as mutable buffers. The slot of the first new token is the ring's row of position
  input_pos - 1 (zero at input_pos 0, the causal zero state), so calling it at an earlier
  position rolls it back (speculative decoding, prefix reuse) as long as that row is in reach.

- `RawKeyModule`: plain Llama's I/O, `(input_ids [1, S], attention_mask [1, P + S],
  position_ids [1, S], *past) -> (logits, *present)`, caches of raw post-RoPE keys that each
  layer shears whole on every call (`RawKeyCache`): the cost of needing no state beside the
  cache is the shear over all P + S cached positions, not S; on the scores `[Hkv, group S,
  P + S]` (the shear is linear in the key), not on the keys `[Hkv, P + S, dh]`.
- `FusedExport`: ONNX Runtime's fused contrib operators over static in-place caches, written
  directly as an ONNX graph (`psa_edge/export/onnx_fused.py`).

An export object provides the pipeline's form-specific pieces: the module, each method's example
inputs and dynamic shapes, the quantization schemes it takes, the calibration inputs of static int8,
the constant methods, and (`build_onnx`) a graph written without tracing.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from psa_edge.contract import CACHE_FIELDS, GraphIO, runner_methods
from psa_edge.model.config import ModelConfig
from psa_edge.model.transformer import LayerCache, PSATransformer, attend


@dataclass(frozen=True)
class Example:
    """One method's example inputs and torch.export dynamic shapes (nested as `forward`'s
    signature, and flat, one entry per input, for re-tracing a converted module)."""
    inputs: tuple
    shapes: tuple
    flat_shapes: tuple


@dataclass(frozen=True)
class Traced:
    """One method's traced graph (an ExportedProgram, or the ONNX ModelProto) and its example."""
    program: object
    example: Example


@dataclass(frozen=True)
class ModelFiles:
    """What the `lower` stage hands to `save`: each model file of the artifact by name, as bytes
    or as a scratch file to move in; `owner` keeps the scratch files alive until then."""
    contents: dict
    owner: object = None

    def write(self, folder: Path) -> int:
        """The files into the artifact folder; their total size in bytes."""
        for name, content in self.contents.items():
            if isinstance(content, bytes):
                (folder / name).write_bytes(content)
            else:  # moved (copied across file systems)
                shutil.move(content, folder / name)
        return sum((folder / name).stat().st_size for name in self.contents)


def graph_io(cfg: ModelConfig, max_len: int, form: str) -> GraphIO:
    return GraphIO.from_config(cfg.to_dict(), max_len, form)


class ExplicitStateModule(nn.Module):
    def __init__(self, model: PSATransformer, form: str):
        super().__init__()
        self.model = model
        self.io = graph_io(model.cfg, model.cfg.max_position_embeddings, form)

    def forward(self, input_ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        n = len(self.io.state_fields)
        state = [dict(zip(self.io.state_fields, past[i:i + n])) for i in range(0, len(past), n)]
        logits, new_state, raws = self.model.forward_with_state(input_ids, state)
        present = [layer[f] for layer in new_state for f in CACHE_FIELDS]
        raw = [torch.cat([layer[f.removeprefix("raw_")] for layer in raws])
               for f in self.io.raw_fields]
        return (logits, *present, *raw)


class RunnerRows:
    """Where a runner-form call reads and writes, computed once per call for every layer."""

    def __init__(self, input_pos: Tensor, seq_len: int, max_seq_len: int, window: int):
        # A Python int for ExecuTorch's llama ops, bounded so that torch.export can prove
        # their checks (start + S <= max) for every chunk length.
        self.start = input_pos[0].item()
        torch._check_is_size(self.start)
        torch._check(self.start + seq_len <= max_seq_len)
        positions = torch.arange(seq_len, device=input_pos.device) + input_pos
        self.positions = positions
        # Every chunk row goes to the ring row of its position, except those older than the
        # window, which all land on the spare last row: no two rows of a call share an index.
        self.ring_rows = torch.where(positions >= positions[-1] + 1 - window,
                                     positions % max(window, 1), window)
        # Clamped, not shifted by + window: ExecuTorch's remainder kernel keeps the sign of a
        # negative dividend, and PT2E's prepare turns a scalar added to int64 positions into a
        # float constant. At input_pos 0 the row read is zeroed by `continues`.
        self.previous_row = (input_pos - 1).clamp(min=0) % max(window, 1)
        self.continues = (input_pos > 0).to(torch.float32)  # 0 at a sequence's start


class StaticCache(LayerCache):
    """One layer's state in the runner form's buffers, written in place at the call's rows:
    the caches `[1, max, Hkv, dh]` by ExecuTorch's llama `update_cache`, read by its
    `custom_sdpa` up to the last written row only (ExecuTorch's own LLM export does the
    same); the raw-key window by index_put_."""

    def __init__(self, module: "RunnerModule", layer: int, rows: RunnerRows):
        super().__init__(module.model.cfg, {})
        self.module, self.layer, self.rows = module, layer, rows

    def buffer(self, name: str) -> Tensor:
        return getattr(self.module, f"{name}_{self.layer}")

    def slot(self, stream: str, gamma: float) -> Tensor | None:
        if gamma == 0:
            return None
        previous = self.buffer(f"raw_{stream}").index_select(2, self.rows.previous_row)
        return previous * self.rows.continues

    @property
    def prev_key(self) -> Tensor | None:
        return self.slot("key", self.cfg.gamma_k)

    @property
    def prev_query(self) -> Tensor | None:
        return self.slot("query", self.cfg.gamma_q)

    def update(self, sheared_key, value, key, query):
        for stream, raw, gamma in (("key", key, self.cfg.gamma_k),
                                   ("query", query, self.cfg.gamma_q)):
            if gamma != 0:
                write_rows(self.buffer(f"raw_{stream}"), self.rows.ring_rows, raw)
        keys, values = self.buffer("cache_key"), self.buffer("cache_value")
        torch.ops.llama.update_cache(sheared_key.transpose(1, 2), keys, self.rows.start)
        torch.ops.llama.update_cache(value.transpose(1, 2), values, self.rows.start)
        return keys, values

    def attend(self, query, keys, values, bias):
        """Causal attention of rows start .. start + S - 1 over cache rows 0 .. start + S - 1
        (ExecuTorch's flash-attention kernel, GQA included); `bias` is not read."""
        b, _, s, _ = query.shape
        attended = torch.ops.llama.custom_sdpa(query.transpose(1, 2), keys, values,
                                               self.rows.start, None, 0, True)
        return attended.reshape(b, s, -1)


def write_rows(buffer: Tensor, rows: Tensor, new: Tensor) -> None:
    """buffer[:, :, rows] = new (the raw-key window), as the index_put_ that ExecuTorch's
    reinplace pass keeps in place (`executorch_target.lower`); without it the write is a copy
    of the whole buffer on every call. Called as the op: `buffer[:, :, rows] = new` drops the
    leading 1 of `new`, which the in-place kernel refuses."""
    torch.ops.aten.index_put_(buffer, [None, None, rows], new)


class RunnerModule(nn.Module):
    def __init__(self, model: PSATransformer, max_seq_len: int, form: str):
        super().__init__()
        # ExecuTorch's llama ops, which its caches are written and read by, registered with
        # torch with the shape functions torch.export traces them by.
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401
        self.model = model
        self.io = graph_io(model.cfg, max_seq_len, form)
        for name, shape in self.io.buffers.items():
            self.register_buffer(name, torch.zeros(shape), persistent=False)

    def forward(self, tokens: Tensor, input_pos: Tensor) -> Tensor:
        rows = RunnerRows(input_pos, tokens.shape[1], self.io.max_seq_len, self.io.window)
        caches = [StaticCache(self, i, rows) for i in range(self.io.num_layers)]
        # key_len 1: the causal mask `decode` builds is not read (custom_sdpa masks itself),
        # and torch.export drops it.
        return self.model.decode(tokens, rows.positions, caches, 1)


class RawKeyCache(LayerCache):
    """One layer's raw-key cache: the chunk's raw keys are concatenated onto the past raw
    keys (what the graph returns as `present`), and attention shears all of them from the
    sequence's start, `x_{-1}` = 0 (the causal zero state), on its scores (`ops.shear_scores`).
    `padding` `[1, P + S]` (0, or -inf where attention_mask is 0) is added to the scores: a
    client's mask, all zeros for batch 1 without padding."""

    def __init__(self, cfg: ModelConfig, past: dict, padding: Tensor):
        super().__init__(cfg, past)
        self.padding = padding

    @property
    def prev_key(self) -> None:  # no slot: `attend` shears the whole cache, on the scores
        return None

    def update(self, sheared_key, value, key, query):
        raw = torch.cat([self.past["key"], key], dim=2)  # [1, Hkv, P + S, dh]
        values = torch.cat([self.past["value"], value], dim=2)
        self.state, self.raw = {"key": raw, "value": values}, {}
        return raw, values

    def attend(self, query, keys, values, bias):
        """The shear on the scores over the raw keys (`attend`'s `key_shear`): dh times fewer
        elementwise ops than shearing the P + S cached keys themselves."""
        return attend(query, keys, values, bias + self.padding, self.cfg.query_group,
                      self.cfg.gamma_k)


class RawKeyModule(nn.Module):
    def __init__(self, model: PSATransformer, form: str):
        super().__init__()
        self.model = model
        self.io = graph_io(model.cfg, model.cfg.max_position_embeddings, form)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                *past: Tensor) -> tuple[Tensor, ...]:
        # -inf where a client masks a position out, 0 elsewhere (not (mask - 1) * inf: 0 * inf
        # is NaN).
        padding = torch.zeros(attention_mask.shape).masked_fill(attention_mask == 0,
                                                               float("-inf"))  # [1, P + S]
        caches = [RawKeyCache(self.model.cfg, {"key": past[i], "value": past[i + 1]}, padding)
                  for i in range(0, len(past), 2)]
        key_len = past[0].shape[2] + input_ids.shape[1]
        logits = self.model.decode(input_ids, position_ids[0], caches, key_len)
        return (logits, *(c.state[f] for c in caches for f in CACHE_FIELDS))


def seq_dim(max_len: int):
    from torch.export import Dim

    return Dim("seq_len", min=1, max=max_len)


class FormExport:
    """The pieces every form's export provides, for the registered form `name`."""
    build_onnx = None  # traced by torch.onnx, unless a form writes its own graph

    def __init__(self, name: str):
        self.name = name

    def constant_methods(self, cfg: ModelConfig, max_len: int) -> dict | None:
        return None


class ExplicitStateExport(FormExport):
    def module(self, model: PSATransformer, max_len: int) -> nn.Module:
        return ExplicitStateModule(model, self.name).eval()

    def methods(self, cfg: ModelConfig, max_len: int) -> dict[str, Example]:
        """`forward` (chunk length S in [1, max]) and `decode` (S = 1); past length P in
        [0, max - 1]. Example sizes 3 and 4: torch.export specialises dims whose example size is
        0 or 1."""
        from torch.export import Dim

        io = graph_io(cfg, max_len, self.name)
        past = Dim("past_len", min=0, max=max_len - 1)
        fields = [key.split(".")[1] for key, _ in io.state_io]
        state = tuple(torch.zeros(io.shape(f, 4)) for f in fields)
        state_shapes = tuple({2: past} if f in CACHE_FIELDS else None for f in fields)
        out = {}
        for name, seq_len, seq in (("forward", 3, {1: seq_dim(max_len)}), ("decode", 1, None)):
            inputs = (torch.zeros(1, seq_len, dtype=torch.long), *state)
            out[name] = Example(inputs, (seq, state_shapes), (seq, *state_shapes))
        return out

    def calibration_inputs(self, cfg: ModelConfig, max_len: int, rows) -> list[tuple]:
        io = graph_io(cfg, max_len, self.name)
        empty = tuple(torch.zeros(io.shape(key.split(".")[1], 0)) for key, _ in io.state_io)
        return [(torch.from_numpy(row)[None], *empty) for row in rows]


class RawKeyExport(FormExport):
    """Every dim dynamic as `Dim.AUTO`: the mask's length is P + S, a sum of two dims that
    `Dim` cannot state, and AUTO lets torch.export keep it a dim of its own."""

    def module(self, model: PSATransformer, max_len: int) -> nn.Module:
        return RawKeyModule(model, self.name).eval()

    def inputs(self, cfg: ModelConfig, max_len: int, tokens: Tensor, past_len: int) -> tuple:
        io = graph_io(cfg, max_len, self.name)
        seq_len = tokens.shape[1]
        past = tuple(torch.zeros(io.shape(key.split(".")[1], past_len)) for key, _ in io.state_io)
        positions = torch.arange(past_len, past_len + seq_len)[None]  # [1, S]
        return (tokens, torch.ones(1, past_len + seq_len, dtype=torch.long), positions, *past)

    def methods(self, cfg: ModelConfig, max_len: int) -> dict[str, Example]:
        from torch.export import Dim

        inputs = self.inputs(cfg, max_len, torch.zeros(1, 3, dtype=torch.long), 4)
        chunk = ({1: Dim.AUTO},) * 3  # input_ids, attention_mask, position_ids
        past = tuple({2: Dim.AUTO} for _ in inputs[3:])
        return {"forward": Example(inputs, (*chunk, past), (*chunk, *past))}

    def calibration_inputs(self, cfg: ModelConfig, max_len: int, rows) -> list[tuple]:
        return [self.inputs(cfg, max_len, torch.from_numpy(row)[None], 0) for row in rows]


class RunnerExport(FormExport):
    def module(self, model: PSATransformer, max_len: int) -> nn.Module:
        return RunnerModule(model, max_len, self.name).eval()

    def methods(self, cfg: ModelConfig, max_len: int) -> dict[str, Example]:
        inputs = (torch.zeros(1, 3, dtype=torch.long), torch.tensor([0]))
        shapes = ({1: seq_dim(max_len)}, None)
        return {"forward": Example(inputs, shapes, shapes)}

    def calibration_inputs(self, cfg: ModelConfig, max_len: int, rows) -> list[tuple]:
        return [(torch.from_numpy(row)[None], torch.tensor([0])) for row in rows]

    def constant_methods(self, cfg: ModelConfig, max_len: int) -> dict | None:
        return runner_methods(cfg.to_dict(), max_len)


class FusedExport(FormExport):
    """ONNX Runtime's fused operators over static caches (`onnx_fused`): built from the
    model's weights, not traced, so its module is the model itself. Its weights are quantized
    without calibration (static int8 needs a traced graph's calibration inputs)."""

    def module(self, model: PSATransformer, max_len: int) -> nn.Module:
        return model.eval()

    def methods(self, cfg: ModelConfig, max_len: int) -> dict[str, Example]:
        return {"forward": Example((), (), ())}

    def build_onnx(self, module: PSATransformer, max_len: int):
        from psa_edge.export.onnx_fused import build

        return build(module, max_len, self.name)

    def calibration_inputs(self, cfg: ModelConfig, max_len: int, rows) -> list[tuple]:
        return []
