"""The ``torch`` engine: a Hugging Face causal LM with a batched, left-padded KV cache.

Sequences join the decode batch after their prefill and leave when released; between
membership changes the batch cache simply grows by one column per step, so steady-state
decoding copies nothing. On a change the cache is re-padded once (rows dropped, joiners
left-padded to the common length, all-padding columns trimmed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers: list[Any] = list(cache.layers)
    return [(layer.keys, layer.values) for layer in layers]


def _cache_from(layers: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    cache = DynamicCache()
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Pad the sequence axis (-2) of a ``[batch, heads, seq, dim]`` tensor on the left."""
    if width == 0:
        return tensor
    shape = list(tensor.shape)
    shape[-2] = width
    return torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


class TorchEngine:
    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self._model = model
        self._device = device
        self._vocab_size = int(model.config.vocab_size)  # the width of the logits rows
        self._rows: list[int] = []  # seq id of each row of the batch cache
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=device)  # 1 = real token
        self._lengths: dict[int, int] = {}
        self._joining: dict[int, DynamicCache] = {}
        self._leaving: set[int] = set()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def stream_ptr(self) -> int:
        if self._device.type == "cuda":
            return int(torch.cuda.current_stream(self._device).cuda_stream)
        return 0

    @torch.inference_mode()
    def prefill(self, seq_id: int, token_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self._device)
        out = self._model(input_ids=ids, use_cache=True, logits_to_keep=1)
        self._joining[seq_id] = out.past_key_values
        self._lengths[seq_id] = len(token_ids)
        logits: torch.Tensor = out.logits[0, -1, :]
        return logits

    @torch.inference_mode()
    def decode(self, seq_ids: Sequence[int], token_ids: Sequence[int]) -> torch.Tensor:
        self._reshape_batch(seq_ids)
        assert self._cache is not None
        row_of = {seq: row for row, seq in enumerate(self._rows)}
        inputs = torch.zeros((len(self._rows), 1), dtype=torch.long, device=self._device)
        positions = torch.zeros((len(self._rows), 1), dtype=torch.long, device=self._device)
        for seq, token in zip(seq_ids, token_ids, strict=True):
            inputs[row_of[seq], 0] = token
            positions[row_of[seq], 0] = self._lengths[seq]
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(self._rows), 1))], dim=1)
        out = self._model(
            input_ids=inputs,
            attention_mask=self._mask,
            position_ids=positions,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._cache = out.past_key_values
        for seq in self._rows:
            self._lengths[seq] += 1
        order = torch.tensor([row_of[seq] for seq in seq_ids], device=self._device)
        logits: torch.Tensor = out.logits[:, -1, :].index_select(0, order)
        return logits

    def release(self, seq_id: int) -> None:
        self._joining.pop(seq_id, None)
        self._lengths.pop(seq_id, None)
        if seq_id in self._rows:
            self._leaving.add(seq_id)
        if self._leaving and self._leaving.issuperset(self._rows):
            self._rows, self._cache, self._leaving = [], None, set()
            self._mask = self._mask.new_zeros((0, 0))

    def _reshape_batch(self, seq_ids: Sequence[int]) -> None:
        """Make the batch cache hold exactly ``seq_ids`` (dropping released rows, adding joiners)."""
        missing = [seq for seq in seq_ids if seq not in self._rows and seq not in self._joining]
        if missing:
            raise KeyError(f"sequences {missing} were never prefilled")
        if self._leaving:
            keep = [row for row, seq in enumerate(self._rows) if seq not in self._leaving]
            self._select_rows(keep)
            self._leaving = set()
        joiners = [seq for seq in seq_ids if seq in self._joining]
        if joiners:
            self._add_rows(joiners)

    def _select_rows(self, rows: list[int]) -> None:
        assert self._cache is not None
        index = torch.tensor(rows, dtype=torch.long, device=self._device)
        mask = self._mask.index_select(0, index)
        trim = int((mask.cumsum(dim=1) == 0).sum(dim=1).min()) if rows else 0
        layers = [
            (keys.index_select(0, index)[:, :, trim:], values.index_select(0, index)[:, :, trim:])
            for keys, values in _layers(self._cache)
        ]
        self._cache = _cache_from(layers)
        self._mask = mask[:, trim:]
        self._rows = [self._rows[row] for row in rows]

    def _add_rows(self, joiners: list[int]) -> None:
        groups: list[tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = []
        if self._cache is not None:
            groups.append((_layers(self._cache), self._mask))
        for seq in joiners:
            mask = torch.ones((1, self._lengths[seq]), dtype=torch.long, device=self._device)
            groups.append((_layers(self._joining.pop(seq)), mask))
        width = max(mask.shape[1] for _, mask in groups)
        layers = []
        for index in range(len(groups[0][0])):
            keys = [_left_pad(group[index][0], width - mask.shape[1]) for group, mask in groups]
            values = [_left_pad(group[index][1], width - mask.shape[1]) for group, mask in groups]
            layers.append((torch.cat(keys), torch.cat(values)))
        self._cache = _cache_from(layers)
        self._mask = torch.cat([_left_pad_mask(mask, width) for _, mask in groups])
        self._rows = self._rows + joiners


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    if mask.shape[1] == width:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], width - mask.shape[1])), mask], dim=1)
