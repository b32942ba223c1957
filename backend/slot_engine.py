"""The ``torch`` engine with a preallocated KV cache: one slot per sequence, decode steps as CUDA graphs.

The growing cache of :mod:`backend.torch_engine` makes every decode step a few hundred small
kernel launches from Python, so on a GPU a step costs what the host takes to launch it, and any
other work on the host (computing masks, sending responses) lengthens it. Here the cache is
allocated once, ``[layers, slots, kv_heads, context + 1, head_dim]`` for keys and for values, and
a sequence owns one slot from prefill to release. A decode step is then the same kernels on the
same addresses every time, which CUDA graphs replay with one call:

- Slots are handed out lowest first. A step runs the first ``rows`` slots, ``rows`` the smallest
  power of two that covers every sequence decoding, and attends over the first ``width``
  columns, the smallest power-of-two multiple of :data:`WIDTH_STEP` that covers the longest one.
  One graph per ``(rows, width)`` is captured the first time that shape is met.
- Each slot's new key and value are written at its own position; a slot in ``rows`` that is not
  decoding this step writes into the spare last column, which no step attends to.
- The step's tokens and positions go to the device in one copy from pinned memory.
- Prompts are prefilled by the Hugging Face model (left-padded batches, as in the growing
  engine), and their keys and values copied into their slots.

The decode step is written out here for Llama-family models (``model_type`` ``llama``: SmolLM2,
Llama 3.x), using the model's own modules for every projection and norm and its rotary table;
:func:`supports` says whether a model qualifies. Attention is grouped-query, computed as two
batched matrix products with the softmax in fp32, as the model's eager attention does.

The cache holds ``slots x (context + 1)`` tokens whatever the requests need, so memory is
bounded by ``max_batch_size`` and the context length; :func:`cache_bytes` says how much.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from backend.engine import PromptScores, current_stream_ptr
from backend.torch_engine import cache_layers, forward_left_padded, output_cache, prefill_in_batches, score_prompt

logger = logging.getLogger(__name__)

WIDTH_STEP = 128  # attention widths are this times a power of two (capped at the context)
_ROPE_TYPES = ("default", "llama3", "linear")  # rotary tables that do not depend on the sequence length


def supports(model: PreTrainedModel) -> str | None:
    """None if the slot engine can run ``model``, else why not."""
    config = model.config
    if config.model_type != "llama":
        return f"model type {config.model_type!r} (the slot engine runs Llama-family models)"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in _ROPE_TYPES:
        return f"rotary embedding type {rope!r}"
    return None


def cache_bytes(model: PreTrainedModel, slots: int, context: int) -> int:
    """Bytes of the keys and values of ``slots`` sequences of ``context`` tokens (plus the spare column)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    per_token = 2 * int(config.num_hidden_layers) * int(config.num_key_value_heads) * int(head_dim) * itemsize
    return slots * (context + 1) * per_token


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SlotEngine:
    def __init__(
        self,
        model: PreTrainedModel,
        device: torch.device,
        *,
        slots: int,
        context: int,
        cuda_graphs: bool | None = None,
    ) -> None:
        reason = supports(model)
        if reason is not None:
            raise ValueError(f"the slot engine cannot run this model: {reason}")
        config = model.config
        self._model = model
        self._device = device
        self._base: Any = model.model
        self._layers: list[Any] = list(self._base.layers)
        self._vocab_size = int(config.vocab_size)
        self._slots = slots
        self._context = context
        self._kv_heads = int(config.num_key_value_heads)
        self._heads = int(config.num_attention_heads)
        attention = self._layers[0].self_attn
        self._head_dim = int(attention.head_dim)
        self._scaling = float(attention.scaling)
        dtype = next(model.parameters()).dtype
        shape = (len(self._layers), slots, self._kv_heads, context + 1, self._head_dim)
        self._keys = torch.zeros(shape, dtype=dtype, device=device)
        self._values = torch.zeros(shape, dtype=dtype, device=device)
        with torch.inference_mode():
            every_position = torch.arange(context + 1, device=device)[None]
            cos, sin = self._base.rotary_emb(self._keys[0, 0, 0], every_position)
        self._cos, self._sin = cos[0], sin[0]  # [context + 1, head_dim]
        self._columns = torch.arange(context + 1, device=device)
        self._slot_index = torch.arange(slots, device=device)
        self._head_index = torch.arange(self._kv_heads, device=device)
        # The step's inputs, per slot: its token, its position; then the slots in the order asked for.
        self._inputs = torch.zeros((3, slots), dtype=torch.long, device=device)
        pin = device.type == "cuda"
        self._staging = torch.zeros((3, slots), dtype=torch.long, pin_memory=pin)
        self._staging_array = self._staging.numpy()
        # The staging buffer's last copy to the device: the next step waits for it before writing.
        self._staged = torch.cuda.Event() if pin else None  # type: ignore[no-untyped-call]
        self._free = list(range(slots))  # a heap: the lowest free slot first
        self._slot_of: dict[int, int] = {}
        self._length: dict[int, int] = {}  # tokens in the cache per sequence
        self._use_graphs = device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: Any = torch.cuda.graph_pool_handle() if self._use_graphs else None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def stream_ptr(self) -> int:
        return current_stream_ptr(self._device)

    @property
    def decode_is_queued(self) -> bool:
        return self._use_graphs

    @property
    def rows(self) -> int:
        """Slots held by sequences (for tests and metrics)."""
        return len(self._slot_of)

    @property
    def graphs(self) -> int:
        """CUDA graphs captured so far, one per decode shape met."""
        return len(self._graphs)

    def score_prompt(self, prompt: Sequence[int], top: int) -> PromptScores:
        return score_prompt(self._model, prompt, top, self._device)

    @torch.inference_mode()
    def prefill(self, seq_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Prefill every prompt into a slot of its own; ``[len(seq_ids), vocab]`` next-token logits, in order."""
        if len(self._free) < len(seq_ids):
            free = len(self._free)
            raise RuntimeError(f"{len(seq_ids)} sequences joined but only {free} of {self._slots} slots are free")
        for prompt in prompts:  # checked before any batch takes a slot
            if len(prompt) >= self._context:
                raise ValueError(f"a prompt of {len(prompt)} tokens leaves no room in a context of {self._context}")
        return prefill_in_batches(seq_ids, prompts, self._prefill_batch)

    def _prefill_batch(self, seq_ids: list[int], prompts: list[Sequence[int]]) -> torch.Tensor:
        out, mask = forward_left_padded(self._model, prompts, self._device)
        layers = cache_layers(output_cache(out))
        width = mask.shape[1]
        for row, (seq, prompt) in enumerate(zip(seq_ids, prompts, strict=True)):
            slot = heapq.heappop(self._free)
            self._slot_of[seq], self._length[seq] = slot, len(prompt)
            for index, (keys, values) in enumerate(layers):
                self._keys[index, slot, :, : len(prompt)] = keys[row, :, width - len(prompt) :]
                self._values[index, slot, :, : len(prompt)] = values[row, :, width - len(prompt) :]
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    @torch.inference_mode()
    def decode(self, seq_ids: Sequence[int], token_ids: Sequence[int]) -> torch.Tensor:
        slots = [self._slot_of[seq] for seq in seq_ids]
        longest = max(self._length[seq] for seq in seq_ids)
        if longest >= self._context:
            raise ValueError(f"a sequence reached the context length ({self._context} tokens)")
        rows, width = self._rows_for(max(slots)), self._width_for(longest)
        if self._staged is not None:
            self._staged.synchronize()  # the last step's copy has left the staging buffer
        staging = self._staging_array
        staging[0, :rows] = 0
        staging[1, :rows] = self._context  # rows not decoding write into the spare column
        staging[0, slots] = token_ids
        staging[1, slots] = [self._length[seq] for seq in seq_ids]
        staging[2, : len(slots)] = slots
        for seq in seq_ids:
            self._length[seq] += 1
        self._inputs[:, :rows].copy_(self._staging[:, :rows], non_blocking=True)
        if self._staged is not None:
            self._staged.record()
        logits = self._run(rows, width)
        return logits.index_select(0, self._inputs[2, : len(slots)])  # no host sync: the step stays queued

    @torch.inference_mode()
    def capture_all(self) -> int:
        """Capture every decode shape now, so that no step waits for a capture; returns how many.

        Call it before any sequence holds a slot: the captures write into the spare column only.
        """
        if not self._use_graphs:
            return 0
        if self._slot_of:
            raise RuntimeError("capture_all must run before sequences hold slots")
        self._inputs[0].zero_()
        self._inputs[1].fill_(self._context)
        rows = {self._rows_for(highest_slot) for highest_slot in range(self._slots)}
        widths = {self._width_for(longest) for longest in range(self._context)}
        for shape in sorted({(r, w) for r in rows for w in widths} - set(self._graphs)):
            self._capture(*shape)
        return len(self._graphs)

    def _rows_for(self, highest_slot: int) -> int:
        return min(_power_of_two_at_least(highest_slot + 1), self._slots)

    def _width_for(self, longest: int) -> int:
        """Columns a step attends over when its longest sequence holds ``longest`` tokens (plus the new one)."""
        return min(WIDTH_STEP * _power_of_two_at_least(-(-(longest + 1) // WIDTH_STEP)), self._context)

    def release(self, seq_id: int) -> None:
        slot = self._slot_of.pop(seq_id, None)
        self._length.pop(seq_id, None)
        if slot is not None:
            heapq.heappush(self._free, slot)

    def _run(self, rows: int, width: int) -> torch.Tensor:
        """The decode step over slots ``[0, rows)``: eagerly, or replayed from the graph of its shape."""
        if not self._use_graphs:
            return self._step(rows, width)
        captured = self._graphs.get((rows, width))
        if captured is None:
            captured = self._capture(rows, width)
        graph, logits = captured
        graph.replay()
        return logits

    def _capture(self, rows: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        logger.info("capturing the decode step for %d rows attending over %d columns", rows, width)
        side = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(side):  # a first run outside the capture, as CUDA graphs require
            self._step(rows, width)
        torch.cuda.current_stream(self._device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._step(rows, width)
        self._graphs[(rows, width)] = (graph, logits)
        return graph, logits

    def _step(self, rows: int, width: int) -> torch.Tensor:
        """One token for slots ``[0, rows)``: ``[rows, vocab]`` logits. Only fixed-shape tensor work."""
        tokens, positions = self._inputs[0, :rows], self._inputs[1, :rows]
        hidden = self._base.embed_tokens(tokens)[:, None, :]  # [rows, 1, hidden]
        cos, sin = self._cos[positions][:, None, :], self._sin[positions][:, None, :]  # [rows, 1, head_dim]
        visible = self._columns[None, :width] <= positions[:, None]
        bias = torch.zeros((rows, width), dtype=torch.float32, device=self._device)
        bias = bias.masked_fill(~visible, float("-inf"))[:, None, None, :]  # [rows, 1, 1, width]
        columns = self._context + 1
        # Where each row's new key goes in a layer's cache viewed as [slots * kv_heads * columns, head_dim].
        cell = self._slot_index[:rows, None] * self._kv_heads + self._head_index[None, :]
        flat = (cell * columns + positions[:, None]).reshape(-1)
        group = self._heads // self._kv_heads
        for index, layer in enumerate(self._layers):
            attention = layer.self_attn
            normed = layer.input_layernorm(hidden)
            query = attention.q_proj(normed).view(rows, self._heads, self._head_dim)
            key = attention.k_proj(normed).view(rows, self._kv_heads, self._head_dim)
            value = attention.v_proj(normed).view(rows, self._kv_heads, self._head_dim)
            query = query * cos + _rotate_half(query) * sin
            key = key * cos + _rotate_half(key) * sin
            self._keys[index].view(-1, self._head_dim).index_copy_(0, flat, key.reshape(-1, self._head_dim))
            self._values[index].view(-1, self._head_dim).index_copy_(0, flat, value.reshape(-1, self._head_dim))
            keys = self._keys[index, :rows, :, :width]  # [rows, kv_heads, width, head_dim]
            values = self._values[index, :rows, :, :width]
            grouped = query.view(rows, self._kv_heads, group, self._head_dim)
            scores = torch.matmul(grouped, keys.transpose(-1, -2)) * self._scaling  # [rows, kv_heads, group, width]
            weights = torch.softmax(scores.float() + bias, dim=-1).to(values.dtype)
            attended = torch.matmul(weights, values).reshape(rows, 1, self._heads * self._head_dim)
            hidden = hidden + attention.o_proj(attended)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        logits: torch.Tensor = self._model.lm_head(self._base.norm(hidden)[:, 0])
        return logits
