"""The messages between the engine and its mask process (``backend.mask_process``, ``backend.mask_child``).

Both sides import them from here, so that what one pickles the other unpickles as the same class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llgtriton.wire import ErrorKind


@dataclass(frozen=True)
class Spec:
    """What the child builds its tokenizers and table from."""

    hf_tokenizer: Any
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    mask_threads: int
    rows: int
    masks_offset: int  # bytes into the shared file (its descriptor is the child's third argument)


@dataclass(frozen=True)
class Add:
    client_id: int
    grammar: str
    prompt_length: int


@dataclass(frozen=True)
class Remove:
    client_id: int


@dataclass(frozen=True)
class Advance:
    """Each request consumes its token; its next mask goes to its row (answered with :class:`Masked`).
    The rows are the step's, of which one child may own only some."""

    client_ids: Sequence[int]
    tokens: Sequence[int]
    rows: Sequence[int]


@dataclass(frozen=True)
class Fill:
    """The next masks of ``client_ids`` into ``rows`` (answered with :class:`Masked`)."""

    client_ids: Sequence[int]
    rows: Sequence[int]


@dataclass(frozen=True)
class Accepting:
    client_id: int


@dataclass(frozen=True)
class Consume:
    client_id: int
    tokens: Sequence[int]


@dataclass(frozen=True)
class Masked:
    """The masks are written: every request's failure so far, how long the child took to consume the
    tokens and compute the masks (seconds), and those of the requests whose output so far is complete
    (their mask allows an end token and their matcher accepts), so that the step that samples an end
    token for one need not ask."""

    failures: Mapping[int, str]
    seconds: float = 0.0
    accepting: tuple[int, ...] = ()


@dataclass(frozen=True)
class Compile:
    key: int
    grammar: str


@dataclass(frozen=True)
class Compiled:
    key: int
    error: tuple[ErrorKind, str] | None = None
