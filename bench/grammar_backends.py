"""llguidance as llgtriton calls it against xgrammar as vLLM and TensorRT-LLM call it, on the CPU (issue 42).

Over the JSONSchemaBench schemas, with the real Llama 3.2 tokenizer (vocab 128256), for each library:
- **coverage**: does the schema compile, are its valid instances accepted and its invalid ones
  rejected (each instance tokenized and fed token by token; accepted means the end of text may follow);
- **compile time** per schema (xgrammar's compiler cache off, so each schema is compiled once, cold);
- **mask time per token** along every valid instance (one sequence, one mask at a time);
- **batched mask fill** for a decoding step of B = 1, 16, 64, 256 sequences, each on its own schema's
  valid instance, all advancing one token per step:
  - ``llguidance``: one ``fill_next_token_bitmask_par`` call over the batch (llgtriton's backend);
  - ``xgrammar_vllm``: vLLM 0.26's ``StructuredOutputManager``: the matchers in turn below 129
    sequences, above that chunks of 16 on a pool of min(cores / 2, 8) threads;
  - ``xgrammar_batch``: xgrammar's own ``BatchGrammarMatcher`` (its threads), for reference;
  - ``xgrammar_trtllm``: TensorRT-LLM's PyTorch backend: one request at a time, in a Python loop.

Both see the same schemas, the same token paths and the same batches, and JSON as ``json.dumps``
writes it (both libraries' default whitespace accepts it).

    python -m bench.grammar_backends --model device_carry/model_llama --out docs/results
"""

from __future__ import annotations

import argparse
import json
import logging
import lzma
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.jsonschemabench import DEFAULT_DATA, instance_text, load_schemas, percentile
from bench.reports import write_report

logger = logging.getLogger("bench.grammar_backends")
BATCHES = (1, 16, 64, 256)
Mask = np.ndarray[Any, np.dtype[np.int32]]
STEPS = 24  # decoding steps timed per batch: every path in a batch is at least this long


def hf_tokenizer(model: Path) -> Any:
    """The model folder's tokenizer; a ``tokenizer.json.xz`` (as it travels) is unpacked first."""
    from transformers import AutoTokenizer

    packed = model / "tokenizer.json.xz"
    if packed.exists() and not (model / "tokenizer.json").exists():
        (model / "tokenizer.json").write_bytes(lzma.decompress(packed.read_bytes()))
    return AutoTokenizer.from_pretrained(model)


class Backend(Protocol):
    """One library's matchers, as one server calls them."""

    name: str

    def compile(self, schema: dict[str, Any]) -> Any: ...
    def matcher(self, compiled: Any) -> Any: ...
    def consume(self, matcher: Any, token: int) -> bool: ...
    def accepting(self, matcher: Any) -> bool: ...
    def fill_one(self, matcher: Any, mask: Mask) -> None: ...
    def fill_batch(self, matchers: Sequence[Any], masks: Mask) -> None: ...


class Llguidance(Backend):
    def __init__(self, hf: Any, vocab: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        from llgtriton.guides import json_schema_grammar

        self.name = "llguidance"
        self._llguidance = llguidance
        self._fill_par = llguidance.numpy.fill_next_token_bitmask_par
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self._grammar = json_schema_grammar
        self.tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=vocab, eos_token=hf.eos_token_id)
        self._executor = llguidance.LLExecutor()  # as GuidanceLogitsProcessor makes it (threads: the cores)

    def compile(self, schema: dict[str, Any]) -> Any:
        template = self._llguidance.LLMatcher(self.tokenizer, self._grammar(schema), log_level=0)
        if template.is_error():
            raise ValueError(template.get_error())
        return template

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def consume(self, matcher: Any, token: int) -> bool:
        return bool(matcher.consume_token(token))

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.is_accepting())

    def fill_one(self, matcher: Any, mask: Mask) -> None:
        self._fill(matcher, mask, 0)

    def fill_batch(self, matchers: Sequence[Any], masks: Mask) -> None:
        self._fill_par(self._executor, [(m, i) for i, m in enumerate(matchers)], masks)


class Xgrammar(Backend):
    """xgrammar 0.2.8, compiled as vLLM's ``XgrammarBackend`` compiles (8 compiler threads)."""

    def __init__(self, hf: Any, vocab: int, fill: str) -> None:
        import xgrammar

        self.name = f"xgrammar_{fill}"
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=8, cache_enabled=False)
        self._eos = hf.eos_token_id
        self._mode = fill
        self._batch = xgrammar.BatchGrammarMatcher() if fill == "batch" else None
        cores = os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(cores // 2, 8))) if fill == "vllm" else None

    def compile(self, schema: dict[str, Any]) -> Any:
        return self._compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def consume(self, matcher: Any, token: int) -> bool:
        return bool(matcher.accept_token(token))

    def accepting(self, matcher: Any) -> bool:
        return bool(matcher.accept_token(self._eos))  # the end of text may follow

    def fill_one(self, matcher: Any, mask: Mask) -> None:
        matcher.fill_next_token_bitmask(mask, 0)

    def fill_batch(self, matchers: Sequence[Any], masks: Mask) -> None:
        if self._batch is not None:
            self._batch.batch_fill_next_token_bitmask(list(matchers), masks)
        elif self._pool is not None and len(matchers) > 128:  # vLLM's fill_bitmask_parallel_threshold

            def fill(first: int) -> None:
                for index in range(first, min(first + 16, len(matchers))):
                    matchers[index].fill_next_token_bitmask(masks, index)

            for future in [self._pool.submit(fill, first) for first in range(0, len(matchers), 16)]:
                future.result()
        else:  # vLLM below its threshold, and TensorRT-LLM always: one request at a time
            for index, matcher in enumerate(matchers):
                matcher.fill_next_token_bitmask(masks, index)


@dataclass
class Coverage:
    """One library over the schemas; what it got right is the totals less its wrong answers."""

    valid_total: int = 0
    invalid_total: int = 0
    compile_ms: list[float] = field(default_factory=list)
    mask_us: list[float] = field(default_factory=list)
    not_compiled: dict[str, str] = field(default_factory=dict)
    wrong: dict[str, tuple[int, int]] = field(default_factory=dict)  # schema -> (valid rejected, invalid accepted)

    def summary(self, schemas: int) -> dict[str, Any]:
        return {
            "schemas": schemas,
            "compiled": len(self.compile_ms),
            "valid_accepted": self.valid_total - sum(v for v, _ in self.wrong.values()),
            "valid_total": self.valid_total,
            "invalid_rejected": self.invalid_total - sum(i for _, i in self.wrong.values()),
            "invalid_total": self.invalid_total,
            "compile_ms": {"p50": percentile(self.compile_ms, 50), "p99": percentile(self.compile_ms, 99)},
            "compile_ms_mean": statistics.fmean(self.compile_ms) if self.compile_ms else float("nan"),
            "mask_us": {
                "tokens": len(self.mask_us),
                "p50": percentile(self.mask_us, 50),
                "p99": percentile(self.mask_us, 99),
                "mean": statistics.fmean(self.mask_us) if self.mask_us else float("nan"),
            },
            "not_compiled": self.not_compiled,
            "wrong": self.wrong,
        }


def follows(backend: Backend, compiled: Any, tokens: Sequence[int], mask: Mask, times: list[float] | None) -> bool:
    """Feeds ``tokens``; True when all are allowed and the end may follow. Times each mask into ``times``."""
    matcher = backend.matcher(compiled)
    for token in tokens:
        if times is not None:
            started = time.perf_counter()
            backend.fill_one(matcher, mask)
            times.append((time.perf_counter() - started) * 1e6)
        if not backend.consume(matcher, token):
            return False
    return backend.accepting(matcher)


def coverage(
    backend: Backend, schemas: Sequence[tuple[str, dict[str, Any]]], encode: Callable[[str], list[int]], vocab: int
) -> tuple[Coverage, dict[str, Any]]:
    """Coverage and per-token times over every schema; returns the compiled grammars by name too."""
    result = Coverage()
    compiled: dict[str, Any] = {}
    mask = np.zeros((1, (vocab + 31) // 32), dtype=np.int32)
    for name, entry in schemas:
        started = time.perf_counter()
        try:
            grammar = backend.compile(entry["schema"])
        except Exception as exc:  # either library refuses some schemas: that is what is counted
            result.not_compiled[name] = str(exc)[:200]
            continue
        result.compile_ms.append((time.perf_counter() - started) * 1e3)
        compiled[name] = grammar
        valid_rejected = invalid_accepted = 0
        for test in entry.get("tests", []):
            tokens = encode(instance_text(test["data"]))
            if test["valid"]:
                result.valid_total += 1
                valid_rejected += not follows(backend, grammar, tokens, mask, result.mask_us)
            else:
                result.invalid_total += 1
                invalid_accepted += follows(backend, grammar, tokens, mask, None)
        if valid_rejected or invalid_accepted:
            result.wrong[name] = (valid_rejected, invalid_accepted)
    return result, compiled


def on_common_schemas(
    schemas: Sequence[tuple[str, dict[str, Any]]], results: dict[str, Coverage], compiled: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Each library's wrong answers over the schemas every library compiled, so the counts compare."""
    common = set.intersection(*(set(grammars) for grammars in compiled.values()))
    tests = [t for name, entry in schemas if name in common for t in entry.get("tests", [])]
    return {
        "schemas": len(common),
        "valid_total": sum(t["valid"] for t in tests),
        "invalid_total": sum(not t["valid"] for t in tests),
        **{
            library: {
                "valid_rejected": sum(v for name, (v, _) in result.wrong.items() if name in common),
                "invalid_accepted": sum(i for name, (_, i) in result.wrong.items() if name in common),
            }
            for library, result in results.items()
        },
    }


def batch_paths(
    schemas: Sequence[tuple[str, dict[str, Any]]],
    encode: Callable[[str], list[int]],
    accepted_by_both: Callable[[str, list[int]], bool],
) -> list[tuple[str, list[int]]]:
    """(schema, token path) of the first valid instance of each schema that both libraries accept,
    at least ``STEPS`` tokens long."""
    paths = []
    for name, entry in schemas:
        for test in entry.get("tests", []):
            tokens = encode(instance_text(test["data"]))
            if test["valid"] and len(tokens) >= STEPS and accepted_by_both(name, tokens):
                paths.append((name, tokens))
                break
    return paths


def batched_fill(
    backend: Backend, compiled: dict[str, Any], paths: Sequence[tuple[str, list[int]]], batch: int, vocab: int
) -> dict[str, float]:
    """Per decoding step of ``batch`` sequences: fill every mask, then every sequence takes its next token."""
    chosen = [paths[i % len(paths)] for i in range(batch)]
    matchers = [backend.matcher(compiled[name]) for name, _ in chosen]
    masks = np.zeros((batch, (vocab + 31) // 32), dtype=np.int32)
    times = []
    for step in range(STEPS):
        started = time.perf_counter()
        backend.fill_batch(matchers, masks)
        times.append((time.perf_counter() - started) * 1e6)
        for matcher, (_, tokens) in zip(matchers, chosen, strict=True):
            if not backend.consume(matcher, tokens[step]):
                raise RuntimeError(f"{backend.name} refused a token of a valid instance")
    return {"step_us_p50": percentile(times, 50), "step_us_p99": percentile(times, 99), "steps": STEPS}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a folder with the tokenizer (Llama 3.2's)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="JSONSchemaBench folder")
    parser.add_argument("--out", type=Path, default=Path("docs/results"))
    parser.add_argument("--name", default="grammar_backends")
    parser.add_argument("--limit", type=int, help="the first N schemas only (a quick run)")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    hf = hf_tokenizer(arguments.model)
    vocab = len(hf)
    schemas = load_schemas(arguments.data)[: arguments.limit]

    def encode(text: str) -> list[int]:
        return list(hf.encode(text, add_special_tokens=False))

    guidance = Llguidance(hf, vocab)
    xgr_vllm = Xgrammar(hf, vocab, "vllm")
    backends: list[Backend] = [guidance, xgr_vllm, Xgrammar(hf, vocab, "batch"), Xgrammar(hf, vocab, "trtllm")]
    report: dict[str, Any] = {
        "tokenizer": str(arguments.model),
        "vocab": vocab,
        "cores": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "coverage": {},
        "batched_fill_us": {},
    }
    compiled: dict[str, dict[str, Any]] = {}
    results: dict[str, Coverage] = {}
    for library in (guidance, xgr_vllm):  # one compile per library; the other xgrammar callers reuse it
        result, compiled[library.name] = coverage(library, schemas, encode, vocab)
        summary = result.summary(len(schemas))
        results[library.name.split("_")[0]] = result
        report["coverage"][library.name.split("_")[0]] = summary
        write_report(arguments.out / f"{arguments.name}.json", report)  # a run cut short keeps what it measured
        logger.info(
            "%s: %s", library.name, json.dumps({k: v for k, v in summary.items() if k not in ("not_compiled", "wrong")})
        )
    report["on_common_schemas"] = on_common_schemas(schemas, results, compiled)
    mask = np.zeros((1, (vocab + 31) // 32), dtype=np.int32)

    def accepted_by_both(name: str, tokens: list[int]) -> bool:
        return all(
            name in compiled[b.name] and follows(b, compiled[b.name][name], tokens, mask, None)
            for b in (guidance, xgr_vllm)
        )

    paths = batch_paths(schemas, encode, accepted_by_both)
    report["batch_paths"] = len(paths)
    for batch in BATCHES:
        row = {}
        for backend in backends:
            grammars = compiled["llguidance" if backend is guidance else "xgrammar_vllm"]
            row[backend.name] = batched_fill(backend, grammars, paths, batch, vocab)
        report["batched_fill_us"][str(batch)] = row
        write_report(arguments.out / f"{arguments.name}.json", report)
        logger.info("B=%d: %s", batch, json.dumps({k: round(v["step_us_p50"]) for k, v in row.items()}))


if __name__ == "__main__":
    main()
