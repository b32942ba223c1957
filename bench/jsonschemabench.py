"""JSONSchemaBench conformance and constraint cost, with SmolLM2's tokenizer (no model needed).

For every schema: compile it (time it), check that each valid instance is accepted and each
invalid one rejected at token level (the instance is tokenized and fed to the matcher), and
time the token mask at every position of the valid instances. An instance rejected as written is
tried once more with its object members in the schema's order (:func:`in_schema_order`; JSON
members have no order, llguidance takes named properties in the schema's order), and counted apart:
a valid one as "accepted once reordered"; an invalid one accepted so is reported, and must not be.
Optionally (``--server``) send a sample of the schemas to a running llgtriton server and validate
what the model generates.

    .venv/bin/python -m bench.jsonschemabench --data ../shared/data/jsonschemabench --out docs/results
    .venv/bin/python -m bench.jsonschemabench --compact   # the layout a request asks for with disable_any_whitespace
    .venv/bin/python -m bench.jsonschemabench --server http://127.0.0.1:9000/v1 --sample 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import referencing.exceptions
from llguidance import LLMatcher, LLTokenizer

from bench.reports import write_report
from llgtriton.guides import COMPACT_JSON, GuideError, check_grammar, json_schema_grammar, with_json_options
from llgtriton.json_schemas import local_target

logger = logging.getLogger("bench.jsonschemabench")
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "jsonschemabench"


@dataclass
class SchemaResult:
    name: str
    compiled: bool
    compile_ms: float
    error: str = ""
    valid_accepted: int = 0  # as written
    valid_reordered: int = 0  # rejected as written, accepted with its members in the schema's order
    valid_total: int = 0
    invalid_rejected: int = 0  # as written
    invalid_reordered_accepted: int = 0  # rejected as written but accepted reordered: must stay 0
    invalid_total: int = 0
    mask_us: list[float] = field(default_factory=list)


# The serving benchmarks' one schema, shared by every constrained request (bench.layers, bench.step_breakdown).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def load_schemas(data: Path) -> list[tuple[str, dict[str, Any]]]:
    schemas = [(path.stem, json.loads(path.read_text())) for path in sorted(data.glob("*.json"))]
    if not schemas:
        raise SystemExit(f"no JSONSchemaBench schemas in {data}")
    return schemas


def instance_text(data: Any) -> str:
    """JSON as json.dumps writes it, which both layouts accept (llgtriton.guides.JSON_OPTIONS, COMPACT_JSON)."""
    return json.dumps(data, ensure_ascii=False)


# $refs and applicable subschemas followed for one value: far above real schemas, and a bound on a
# schema that refers to itself without consuming the instance.
MAX_ORDER_STEPS = 256


def in_schema_order(instance: Any, schema: Any) -> Any:
    """``instance`` with every object's members in the order llguidance writes them: the properties
    named by the ``properties`` of the schemas that apply to it, in their order there, then the other
    members in their own order. JSON object members have no order (RFC 8259), so the value is the
    same instance; llguidance accepts named properties only in the schema's order.

    The schemas that apply to a value: its schema, a local ``$ref``'s target, ``allOf`` entries,
    the ``anyOf``/``oneOf`` branches the ``jsonschema`` validator says the value matches, and
    ``then``/``else`` as ``if`` decides; a member's value is walked with the ``properties`` entry
    that names it, else the ``patternProperties`` it matches, else ``additionalProperties``.
    """
    validator = jsonschema.validators.validator_for(schema)(schema)
    return _ordered(instance, [schema], schema, validator)


def _applicable(value: Any, schemas: list[Any], root: Any, validator: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    pending = list(reversed(schemas))
    seen: set[int] = set()
    while pending and len(seen) < MAX_ORDER_STEPS:
        schema = pending.pop()
        if not isinstance(schema, dict) or id(schema) in seen:
            continue
        seen.add(id(schema))
        found.append(schema)
        inner: list[Any] = []
        if isinstance(schema.get("$ref"), str):
            inner.append(local_target(root, schema["$ref"]))
        inner.extend(schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else [])
        for keyword in ("anyOf", "oneOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list):
                inner.extend(b for b in branches if validator.evolve(schema=b).is_valid(value))
        if "if" in schema:
            inner.append(schema.get("then" if validator.evolve(schema=schema["if"]).is_valid(value) else "else"))
        pending.extend(reversed(inner))
    return found


def _ordered(value: Any, schemas: list[Any], root: Any, validator: Any) -> Any:
    if not isinstance(value, dict | list):
        return value
    applicable = _applicable(value, schemas, root, validator)
    if isinstance(value, list):
        return [_ordered(item, _item_schemas(applicable, index), root, validator) for index, item in enumerate(value)]
    named: dict[str, None] = {}
    for schema in applicable:
        declared = schema.get("properties")
        named.update(dict.fromkeys(declared if isinstance(declared, dict) else ()))
    keys = [key for key in named if key in value] + [key for key in value if key not in named]
    return {key: _ordered(value[key], _member_schemas(applicable, key), root, validator) for key in keys}


def _member_schemas(applicable: list[dict[str, Any]], key: str) -> list[Any]:
    found: list[Any] = []
    for schema in applicable:
        declared, patterns = schema.get("properties"), schema.get("patternProperties")
        if isinstance(declared, dict) and key in declared:
            found.append(declared[key])
            continue
        matched = [s for p, s in patterns.items() if re.search(p, key)] if isinstance(patterns, dict) else []
        found.extend(matched or [schema.get("additionalProperties")])
    return found


def _item_schemas(applicable: list[dict[str, Any]], index: int) -> list[Any]:
    found: list[Any] = []
    for schema in applicable:
        items, prefix = schema.get("items"), schema.get("prefixItems")
        if isinstance(prefix, list):
            found.append(prefix[index] if index < len(prefix) else items)
        elif isinstance(items, list):
            found.append(items[index] if index < len(items) else schema.get("additionalItems"))
        else:
            found.append(items)
    return found


def accepts(template: LLMatcher, tokenizer: LLTokenizer, text: str, mask_us: list[float] | None) -> bool:
    matcher = template.deep_copy()
    mask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
    for token in tokenizer.tokenize_str(text):
        if mask_us is not None:
            started = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            mask_us.append((time.perf_counter() - started) * 1e6)
        if not matcher.consume_token(token):
            return False
    return matcher.is_accepting()


def check_schema(name: str, entry: dict[str, Any], tokenizer: LLTokenizer, compact: bool = False) -> SchemaResult:
    compile_ms = float("nan")
    try:
        schema = with_json_options(entry["schema"], COMPACT_JSON) if compact else entry["schema"]
        grammar = json_schema_grammar(schema)
        check_grammar(grammar)  # what the proxy does before a request reaches Triton
        started = time.perf_counter()
        template = LLMatcher(tokenizer, grammar, log_level=0)  # what the backend does, once per schema
        compile_ms = (time.perf_counter() - started) * 1e3
        error = template.get_error() if template.is_error() else ""
    except GuideError as exc:
        error = str(exc)
    result = SchemaResult(name, compiled=not error, compile_ms=compile_ms, error=error[:200])
    if error:
        return result
    for test in entry.get("tests", []):
        data, ok = test["data"], test["valid"]
        as_written = accepts(template, tokenizer, instance_text(data), result.mask_us if ok else None)
        # Only an instance rejected as written is tried again, with its members in the schema's order.
        reordered = not as_written and _reordered_accepted(template, tokenizer, data, entry["schema"])
        result.valid_total += ok
        result.valid_accepted += ok and as_written
        result.valid_reordered += ok and reordered
        result.invalid_total += not ok
        result.invalid_rejected += not ok and not as_written
        result.invalid_reordered_accepted += not ok and reordered
    return result


def _reordered_accepted(template: LLMatcher, tokenizer: LLTokenizer, data: Any, schema: Any) -> bool:
    try:
        reordered = in_schema_order(data, schema)
    except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable, re.error, RecursionError):
        # the validator cannot judge a branch: the instance counts as rejected either way
        return False
    text = instance_text(reordered)
    return text != instance_text(data) and accepts(template, tokenizer, text, None)


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def summarize(results: list[SchemaResult]) -> dict[str, Any]:
    compiled = [r for r in results if r.compiled]
    masks = [m for r in compiled for m in r.mask_us]
    compile_ms = [r.compile_ms for r in compiled]
    valid_total = sum(r.valid_total for r in compiled)
    invalid_total = sum(r.invalid_total for r in compiled)
    return {
        "schemas": len(results),
        "compiled": len(compiled),
        "compile_rate": len(compiled) / len(results),
        "valid_accepted": sum(r.valid_accepted for r in compiled),  # as written
        "valid_accepted_once_reordered": sum(r.valid_reordered for r in compiled),
        "valid_rejected_either_way": sum(r.valid_total - r.valid_accepted - r.valid_reordered for r in compiled),
        "valid_total": valid_total,
        "invalid_rejected": sum(r.invalid_rejected for r in compiled),  # as written
        "invalid_accepted_once_reordered": sum(r.invalid_reordered_accepted for r in compiled),  # must be 0
        "invalid_total": invalid_total,
        "schemas_in_full_agreement": sum(
            r.valid_accepted == r.valid_total and r.invalid_rejected == r.invalid_total for r in compiled
        ),
        "mask_us": {
            "tokens": len(masks),
            "mean": statistics.fmean(masks) if masks else float("nan"),
            "p50": percentile(masks, 50),
            "p99": percentile(masks, 99),
            "max": max(masks, default=float("nan")),
        },
        "compile_ms": {
            "mean": statistics.fmean(compile_ms),
            "p50": percentile(compile_ms, 50),
            "p99": percentile(compile_ms, 99),
            "max": max(compile_ms),
        },
        "not_compiled": {r.name: r.error for r in results if not r.compiled},
        "disagreements": {
            r.name: {
                "valid_rejected": r.valid_total - r.valid_accepted,
                "valid_accepted_once_reordered": r.valid_reordered,
                "invalid_accepted": r.invalid_total - r.invalid_rejected,
                "invalid_accepted_once_reordered": r.invalid_reordered_accepted,
            }
            for r in compiled
            if r.valid_accepted != r.valid_total or r.invalid_rejected != r.invalid_total
        },
    }


def smol_tokenizer() -> LLTokenizer:
    import llguidance.hf
    from transformers import AutoTokenizer

    from backend.model_loader import checkpoint_path
    from llgtriton.settings import EngineSettings

    hf: Any = AutoTokenizer.from_pretrained(checkpoint_path(EngineSettings()))
    return llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=hf.eos_token_id)


async def generate_sample(
    base_url: str, schemas: list[tuple[str, dict[str, Any]]], concurrency: int, max_tokens: int
) -> dict[str, Any]:
    """Ask the model for an instance of each schema through the OpenAI API and validate it."""
    import jsonschema
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=1800)
    limit = asyncio.Semaphore(concurrency)

    async def one(name: str, schema: dict[str, Any]) -> dict[str, Any]:
        prompt = "Write one JSON value that matches this JSON schema:\n" + json.dumps(schema)[:3000]
        async with limit:
            response = await client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=[{"role": "user", "content": prompt}],
                temperature=0,
                max_tokens=max_tokens,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            )
        text = response.choices[0].message.content or ""
        finish = response.choices[0].finish_reason
        try:
            jsonschema.validators.validator_for(schema)(schema).validate(json.loads(text))
            valid, problem = True, ""
        except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
            valid, problem = False, str(exc)[:200]
        return {
            "name": name,
            "finish": finish,
            "valid": valid,
            "problem": problem,
            "tokens": response.usage.completion_tokens if response.usage else 0,
        }

    try:
        outcomes = await asyncio.gather(*(one(name, entry["schema"]) for name, entry in schemas))
    finally:
        await client.close()
    finished = [o for o in outcomes if o["finish"] == "stop"]
    return {
        "sent": len(outcomes),
        "finished": len(finished),
        "finished_valid": sum(o["valid"] for o in finished),
        "cut_by_max_tokens": len(outcomes) - len(finished),
        "invalid_finished": [o for o in finished if not o["valid"]],
        "outcomes": outcomes,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="JSONSchemaBench folder")
    parser.add_argument("--out", type=Path, default=Path("docs/results"), help="where to write the JSON report")
    parser.add_argument("--server", help="OpenAI base URL of a running llgtriton; generate a sample through it")
    parser.add_argument("--sample", type=int, default=40, help="schemas to generate for (every n-th compiled one)")
    parser.add_argument("--compact", action="store_true", help="compile with the compact JSON layout")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=384, help="per generated instance")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    schemas = load_schemas(arguments.data)
    tokenizer = smol_tokenizer()
    results = []
    for index, (name, entry) in enumerate(schemas):
        results.append(check_schema(name, entry, tokenizer, arguments.compact))
        if index % 50 == 0:
            logger.info("%d/%d schemas", index, len(schemas))
    report: dict[str, Any] = {"conformance": summarize(results)}
    if arguments.server:
        compiled = [(n, e) for (n, e), r in zip(schemas, results, strict=True) if r.compiled]
        step = max(1, len(compiled) // arguments.sample)
        report["generation"] = asyncio.run(
            generate_sample(
                arguments.server, compiled[::step][: arguments.sample], arguments.concurrency, arguments.max_tokens
            )
        )
    name = "jsonschemabench_generation.json" if arguments.server else "jsonschemabench.json"
    if arguments.compact:
        name = name.replace(".json", "_compact.json")
    write_report(arguments.out / name, report)
    summary = {k: v for k, v in report["conformance"].items() if k not in ("not_compiled", "disagreements")}
    logger.info("%s", json.dumps(summary, indent=2))
    if "generation" in report:
        logger.info("%s", json.dumps({k: v for k, v in report["generation"].items() if k != "outcomes"}, indent=2))


if __name__ == "__main__":
    main()
