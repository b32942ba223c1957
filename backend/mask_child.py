"""The mask process's own side: its matchers, its grammar cache, and the loops that serve the engine.

Started by ``backend.mask_process`` as ``python -c "from backend.mask_child import main; main()"`` with
its sockets' descriptors as arguments: one :class:`~backend.matcher_table.MatcherTable` and one
:class:`~backend.grammar_cache.GrammarCache` of its own, the step messages answered in order on one
thread (a list of them in order: the ones the engine held back to send with the next), grammars
compiled ahead on a few others.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection

from llguidance import LLMatcher

from backend.errors import BackendError, error_kind
from backend.grammar_cache import GrammarCache, lanes_for
from backend.guidance_tokenizer import guidance_tokenizers
from backend.mask_messages import Accepting, Add, Advance, Compile, Compiled, Consume, Fill, Masked, Remove, Spec
from backend.matcher_table import Bitmask, MatcherTable, mask_words
from backend.shared_masks import map_shared_masks

logger = logging.getLogger(__name__)

_COMPILE_THREADS = 4


def _serve_compiles(compiles: Connection, grammars: GrammarCache, lock: threading.Lock) -> None:
    pool = ThreadPoolExecutor(max_workers=_COMPILE_THREADS, thread_name_prefix="llgtriton-mask-compile")

    def compile_one(request: Compile) -> None:
        try:
            grammars.ready(request.grammar)
            answer = Compiled(request.key)
        except Exception as exc:
            if not isinstance(exc, BackendError):
                logger.exception("compiling a grammar in the mask process failed")
            answer = Compiled(request.key, (error_kind(exc), str(exc)))
        with lock:
            compiles.send(answer)

    while True:
        try:
            request = compiles.recv()
        except (OSError, EOFError):
            return
        pool.submit(compile_one, request)


@dataclass(frozen=True)
class _StepServer:
    """The step messages' side: answered in order, on one thread."""

    steps: Connection
    table: MatcherTable
    grammars: GrammarCache
    masks: Bitmask
    failed: LLMatcher  # stands in for a matcher whose grammar failed

    def serve(self) -> None:
        while True:
            try:
                received = self.steps.recv()
            except (OSError, EOFError):
                return  # the engine is gone
            try:
                for message in received if isinstance(received, list) else (received,):
                    self._answer(message)
            except (OSError, EOFError):
                return

    def _answer(self, message: object) -> None:
        table, masks, steps = self.table, self.masks, self.steps
        started = time.perf_counter()
        try:
            if isinstance(message, Advance):
                table.advance(message.client_ids, message.tokens, masks, message.rows)
                accepting = table.accepting(message.client_ids, masks, message.rows)
                steps.send(Masked(dict(table.failures), time.perf_counter() - started, accepting))
            elif isinstance(message, Fill):
                table.fill_rows(message.client_ids, masks, message.rows)
                accepting = table.accepting(message.client_ids, masks, message.rows)
                steps.send(Masked(dict(table.failures), time.perf_counter() - started, accepting))
            elif isinstance(message, Add):
                _add(table, self.grammars, message, self.failed)
            elif isinstance(message, Remove):
                table.remove(message.client_id)
            elif isinstance(message, Accepting):
                steps.send(table.is_accepting(message.client_id))
            elif isinstance(message, Consume):
                table.consume(message.client_id, message.tokens)
            else:
                logger.error("the mask process got an unknown message: %r", message)
        except (OSError, EOFError):
            raise
        except Exception as exc:  # a bug: its requests end, every other request goes on
            logger.exception("the mask process failed on %s", type(message).__name__)
            if isinstance(message, Advance | Fill):
                for cid in message.client_ids:
                    table.fail(cid, f"computing the token masks failed: {exc}")
                masks[list(message.rows)] = table.eos_only
                steps.send(Masked(dict(table.failures)))


def _add(table: MatcherTable, grammars: GrammarCache, message: Add, failed: LLMatcher) -> None:
    """Its matcher from the cache (``prepare`` compiled it); compiled here if the cache let it go since.
    A grammar that fails now still gets a row, an EOS-only one, so that rows keep their order."""
    try:
        copy = grammars.cached_copy(message.grammar) or grammars.copy(message.grammar)
    except Exception as exc:
        table.add(message.client_id, failed, message.prompt_length)
        table.fail(message.client_id, f"compiling the constraint in the mask process failed: {exc}")
        return
    table.add(message.client_id, copy.matcher, message.prompt_length, copy.lane, first_mask=copy.first_mask)


def main() -> None:
    """The child: ``sys.argv`` holds its two sockets' descriptors. (Started by importing this module,
    not as ``__main__``, so that the messages it pickles name their classes here.)"""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s mask-process %(levelname)s %(message)s")
    steps = Connection(int(sys.argv[1]))
    compiles = Connection(int(sys.argv[2]))
    shared_fd = int(sys.argv[3])
    try:
        spec: Spec = steps.recv()
        tokenizers = guidance_tokenizers(spec.hf_tokenizer, spec.vocab_size, spec.eos_token_ids)
        table = MatcherTable(tokenizers.text, spec.mask_threads)
        grammars = GrammarCache(tokenizers.text, lanes=lanes_for(spec.mask_threads), plain_tokenizer=tokenizers.plain)
        masks = map_shared_masks(shared_fd, spec.masks_offset, spec.rows, mask_words(spec.vocab_size))
        failed = LLMatcher(tokenizers.text, "%% not a grammar", log_level=0)  # stands in for one that failed
    except Exception as exc:
        logger.exception("the mask process could not start")
        steps.send(f"{type(exc).__name__}: {exc}")
        return
    steps.send("ready")
    threading.Thread(target=_serve_compiles, args=(compiles, grammars, threading.Lock()), daemon=True).start()
    _StepServer(steps, table, grammars, masks, failed).serve()
