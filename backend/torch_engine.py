"""The ``torch`` engine: a Hugging Face causal LM with a batched, left-padded KV cache.

Prompts admitted in the same step are prefilled together: left-padded into batches of at most
``PREFILL_TOKEN_BUDGET`` tokens (shortest first, so little padding), one forward pass each.
Sequences then join the decode batch together, with one re-pad of the cache. Between
membership changes the batch cache grows by one column per step, so steady-state decoding
copies nothing.

A sequence that leaves only marks its row dead: the row keeps being computed (and ignored)
until a quarter of the rows are dead or sequences join, and only then is the cache compacted
(dead rows dropped, all-padding columns trimmed). A departure therefore costs nothing on the
step it happens, and a batch whose rows leave one by one is compacted a few times, not once per
departure.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from backend.engine import PromptScores, current_stream_ptr

# Padded prompt tokens per prefill forward pass: bounds the activation memory of a burst of arrivals.
PREFILL_TOKEN_BUDGET = 8192
_DEAD = -1  # the seq id of a released row that is still in the batch cache

_Layers = list[tuple[torch.Tensor, torch.Tensor]]


def cache_layers(cache: DynamicCache) -> _Layers:
    layers: list[Any] = list(cache.layers)
    return [(layer.keys, layer.values) for layer in layers]


def cache_keyword(model: PreTrainedModel) -> str:
    """The name ``model.forward`` takes its KV cache under: ``cache`` since transformers 5.2x renamed
    ``past_key_values`` (deprecated, removed in 5.40); older releases know only the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(out: Any) -> DynamicCache:
    """The KV cache of a model output, under either release's name (the old one warns on new releases)."""
    cache: DynamicCache = out["cache"] if "cache" in out else out["past_key_values"]
    return cache


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


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    if mask.shape[1] == width:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], width - mask.shape[1])), mask], dim=1)


def prefill_in_batches(
    seq_ids: Sequence[int],
    prompts: Sequence[Sequence[int]],
    prefill_batch: Callable[[list[int], list[Sequence[int]]], torch.Tensor],
) -> torch.Tensor:
    """Prompts shortest first, in batches of at most ``PREFILL_TOKEN_BUDGET`` padded tokens; logits in order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    logits: list[torch.Tensor | None] = [None] * len(prompts)
    start = 0
    while start < len(order):
        end = start + 1  # the longest prompt so far is the last one: padded tokens = count * its length
        while end < len(order) and (end + 1 - start) * len(prompts[order[end]]) <= PREFILL_TOKEN_BUDGET:
            end += 1
        chosen = order[start:end]
        rows = prefill_batch([seq_ids[i] for i in chosen], [prompts[i] for i in chosen])
        for i, row in zip(chosen, rows, strict=True):
            logits[i] = row
        start = end
    return torch.stack([row for row in logits if row is not None])


def forward_left_padded(
    model: PreTrainedModel, prompts: Sequence[Sequence[int]], device: torch.device
) -> tuple[Any, torch.Tensor]:
    """One forward pass over left-padded prompts: the model's output (last position) and the ``[rows, width]`` mask."""
    width = max(len(prompt) for prompt in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    return out, mask


SCORED_ROWS = 512  # prompt positions whose vocabulary-wide logits exist at once while scoring


@torch.inference_mode()
def score_prompt(model: PreTrainedModel, prompt: Sequence[int], top: int, device: torch.device) -> PromptScores:
    """The model's log probability of each prompt token after the first, given the ones before it.

    The decoder runs once over the whole prompt; the output head runs on :data:`SCORED_ROWS`
    positions at a time, so a long prompt never holds ``len(prompt) x vocab`` logits.
    """
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    decoder: Any = model.get_decoder()  # type: ignore[no-untyped-call]
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
    head: Any = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    logprobs: list[float] = []
    alternatives: list[tuple[tuple[int, float], ...]] = []
    for start in range(0, len(prompt) - 1, SCORED_ROWS):
        end = min(start + SCORED_ROWS, len(prompt) - 1)
        rows = torch.log_softmax(head(hidden[start:end]).float(), dim=-1)
        logprobs += rows.gather(1, ids[0, start + 1 : end + 1, None])[:, 0].tolist()
        if top > 0:
            values, tokens = rows.topk(min(top, rows.shape[-1]), dim=-1)
            alternatives += [
                tuple(zip(row_tokens, row_values, strict=True))
                for row_tokens, row_values in zip(tokens.tolist(), values.tolist(), strict=True)
            ]
        else:
            alternatives += [()] * (end - start)
    return PromptScores(tuple(logprobs), tuple(alternatives))


@dataclass
class _Group:
    """Rows of one cache: the decode batch, or prefilled prompts waiting to join it."""

    rows: list[int]  # seq id per row (_DEAD: released)
    cache: DynamicCache  # the model's own cache object, handed back to it step after step
    mask: torch.Tensor  # [rows, columns], 1 = a real token

    def select(self, keep: list[int]) -> _Group:
        """Only the rows ``keep``, with the columns that are padding in every one of them trimmed."""
        if keep == list(range(len(self.rows))):
            return self
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        trim = int((mask.cumsum(dim=1) == 0).sum(dim=1).min()) if keep else 0
        layers = [
            (keys.index_select(0, index)[:, :, trim:], values.index_select(0, index)[:, :, trim:])
            for keys, values in cache_layers(self.cache)
        ]
        return _Group([self.rows[row] for row in keep], _cache_from(layers), mask[:, trim:])

    def live(self) -> _Group:
        return self.select([row for row, seq in enumerate(self.rows) if seq != _DEAD])


def _concatenate(groups: Sequence[_Group]) -> _Group:
    """One cache holding every group's rows, each left-padded to the widest."""
    width = max(group.mask.shape[1] for group in groups)
    padded = [
        [
            (_left_pad(keys, width - group.mask.shape[1]), _left_pad(values, width - group.mask.shape[1]))
            for keys, values in cache_layers(group.cache)
        ]
        for group in groups
    ]
    layers = [
        (torch.cat([group[index][0] for group in padded]), torch.cat([group[index][1] for group in padded]))
        for index in range(len(padded[0]))
    ]
    mask = torch.cat([_left_pad_mask(group.mask, width) for group in groups])
    return _Group([seq for group in groups for seq in group.rows], _cache_from(layers), mask)


class TorchEngine:
    def __init__(self, model: PreTrainedModel, device: torch.device) -> None:
        self._model = model
        self._device = device
        self._vocab_size = int(model.config.vocab_size)  # the width of the logits rows
        self._batch: _Group | None = None
        self._lengths: dict[int, int] = {}  # tokens in the cache per live sequence
        self._joining: list[_Group] = []
        self._cache_keyword = cache_keyword(model)

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
        return False  # a few hundred launches from Python: the host work is most of the step

    @property
    def rows(self) -> int:
        """Rows in the decode batch cache, dead ones included (for tests and metrics)."""
        return 0 if self._batch is None else len(self._batch.rows)

    def score_prompt(self, prompt: Sequence[int], top: int) -> PromptScores:
        return score_prompt(self._model, prompt, top, self._device)

    @torch.inference_mode()
    def prefill(self, seq_ids: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Prefill every prompt; ``[len(seq_ids), vocab]`` next-token logits in the order given."""
        return prefill_in_batches(seq_ids, prompts, self._prefill_batch)

    def _prefill_batch(self, seq_ids: list[int], prompts: list[Sequence[int]]) -> torch.Tensor:
        out, mask = forward_left_padded(self._model, prompts, self._device)
        self._joining.append(_Group(list(seq_ids), output_cache(out), mask))
        for seq, prompt in zip(seq_ids, prompts, strict=True):
            self._lengths[seq] = len(prompt)
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits

    @torch.inference_mode()
    def decode(self, seq_ids: Sequence[int], token_ids: Sequence[int]) -> torch.Tensor:
        batch = self._reshape_batch(seq_ids)
        row_of = {seq: row for row, seq in enumerate(batch.rows) if seq != _DEAD}
        inputs = torch.zeros((len(batch.rows), 1), dtype=torch.long)
        positions = torch.zeros((len(batch.rows), 1), dtype=torch.long)
        for seq, token in zip(seq_ids, token_ids, strict=True):
            inputs[row_of[seq], 0] = token
            positions[row_of[seq], 0] = self._lengths[seq]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        out = self._model(
            input_ids=inputs.to(self._device),
            attention_mask=batch.mask,
            position_ids=positions.to(self._device),
            use_cache=True,
            **{self._cache_keyword: batch.cache},
        )
        batch.cache = output_cache(out)
        for seq in row_of:
            self._lengths[seq] += 1
        order = torch.tensor([row_of[seq] for seq in seq_ids], device=self._device)
        logits: torch.Tensor = out.logits[:, -1, :].index_select(0, order)
        return logits

    def release(self, seq_id: int) -> None:
        self._lengths.pop(seq_id, None)
        for group in [*self._joining, *([self._batch] if self._batch is not None else [])]:
            group.rows = [_DEAD if seq == seq_id else seq for seq in group.rows]
        self._joining = [group for group in self._joining if any(seq != _DEAD for seq in group.rows)]
        if self._batch is not None and all(seq == _DEAD for seq in self._batch.rows):
            self._batch = None

    def _reshape_batch(self, seq_ids: Sequence[int]) -> _Group:
        """The batch cache with every sequence of ``seq_ids``: joiners added, compacted when due."""
        joining = {seq for group in self._joining for seq in group.rows}
        present = set() if self._batch is None else set(self._batch.rows)
        missing = [seq for seq in seq_ids if seq not in present and seq not in joining]
        if missing:
            raise KeyError(f"sequences {missing} were never prefilled")
        batch = self._batch
        dead = 0 if batch is None else batch.rows.count(_DEAD)
        if self._joining:
            groups = ([batch.live()] if batch is not None else []) + [group.live() for group in self._joining]
            batch, self._joining = _concatenate(groups), []
        elif batch is not None and dead * 4 >= len(batch.rows):
            batch = batch.live()
        assert batch is not None
        self._batch = batch
        return batch
