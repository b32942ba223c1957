"""The TensorRT-LLM tools' arguments a prepare config may set, checked by name and kind before anything runs."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic_core import PydanticCustomError

from llgtriton.prepared import ENGINE_DIR, TRTLLM_CHECKPOINT_DIR

ArgValue = str | int | float | bool | list[str]
# switch: a store_true flag (true: --name, false: omitted); feature: --name enable|disable;
# plugin: --name <dtype>|disable; value: --name <value>; values: --name <v1> <v2> ...
OptionKind = Literal["switch", "feature", "plugin", "value", "values"]

# fmt: off
# trtllm-build's long options: tensorrt_llm/commands/build.py (parse_arguments) and the plugin
# options it adds from tensorrt_llm/plugin/plugin.py (cli_plugin_args), TensorRT-LLM tag v1.2.0.
TRTLLM_BUILD_SWITCHES = frozenset({
    "strip_plan", "weight_sparsity", "weight_streaming", "fast_build", "enable_debug_output", "dry_run",
    "monitor_memory", "gather_context_logits", "gather_generation_logits", "gather_all_token_logits",
})
TRTLLM_BUILD_FEATURES = frozenset({
    "context_fmha", "bert_context_fmha_fp32_acc", "remove_input_padding", "paged_kv_cache", "use_paged_context_fmha",
    "use_fp8_context_fmha", "fuse_fp4_quant", "multiple_profiles", "paged_state", "streamingllm", "norm_quant_fusion",
    "reduce_fusion", "user_buffer", "use_fused_mlp", "pp_reduce_scatter", "dora_plugin",
})
TRTLLM_BUILD_PLUGINS = frozenset({
    "bert_attention_plugin", "gpt_attention_plugin", "gemm_plugin", "gemm_swiglu_plugin", "fp8_rowwise_gemm_plugin",
    "lora_plugin", "moe_plugin", "mamba_conv1d_plugin", "nccl_plugin", "low_latency_gemm_plugin",
    "low_latency_gemm_swiglu_plugin", "gemm_allreduce_plugin",
})
TRTLLM_BUILD_VALUES = frozenset({
    "build_config", "model_cls_file", "model_cls_name", "max_batch_size", "max_input_len", "max_seq_len",
    "max_decoder_seq_len", "max_beam_width", "max_num_tokens", "opt_num_tokens", "max_encoder_input_len",
    "max_prompt_embedding_table_size", "max_multimodal_len", "kv_cache_type", "tokens_per_block",
    "input_timing_cache", "output_timing_cache", "profiling_verbosity", "workers", "log_level", "visualize_network",
    "logits_dtype", "lora_ckpt_source", "max_lora_rank", "speculative_decoding_mode", "max_draft_len",
})
# fmt: on
TRTLLM_BUILD_LISTS = frozenset({"lora_dir", "lora_target_modules"})
TRTLLM_BUILD_SET_BY_US = {
    "checkpoint_dir": f"OUTPUT/{TRTLLM_CHECKPOINT_DIR}, the converted checkpoint",
    "output_dir": f"OUTPUT/{ENGINE_DIR}",
    "model_config": "--checkpoint_dir, which trtllm-build prefers to it",
}
TRTLLM_BUILD_ARGS = (
    TRTLLM_BUILD_SWITCHES
    | TRTLLM_BUILD_FEATURES
    | TRTLLM_BUILD_PLUGINS
    | TRTLLM_BUILD_VALUES
    | TRTLLM_BUILD_LISTS
    | frozenset(TRTLLM_BUILD_SET_BY_US)
)

# fmt: off
# The flags most examples/models/core/<family>/convert_checkpoint.py scripts share (llama's, v1.2.0).
# A family's own flags go in build.convert.extra_args, passed through unchecked.
CONVERT_SWITCHES = frozenset({
    "use_weight_only", "disable_weight_only_quant_plugin", "per_group", "per_channel", "per_token", "int8_kv_cache",
    "fp8_kv_cache", "use_fp8", "use_fp8_rowwise", "use_nvfp4", "use_qserve", "use_parallel_embedding",
    "load_by_shard", "load_model_on_cpu",
})
CONVERT_VALUES = frozenset({
    "dtype", "tp_size", "pp_size", "cp_size", "moe_tp_size", "moe_ep_size", "weight_only_precision", "group_size",
    "smoothquant", "quant_ckpt_path", "calib_dataset", "calib_size", "calib_max_seq_length", "embedding_sharding_dim",
    "workers", "log_level",
})
# fmt: on
CONVERT_SET_BY_US = {
    "model_dir": "SOURCE",
    "output_dir": f"OUTPUT/{TRTLLM_CHECKPOINT_DIR}",
}


@dataclass(frozen=True)
class Tool:
    label: str
    kinds: Mapping[str, OptionKind]
    set_by_us: Mapping[str, str]
    hint: str = ""

    def problems(self, args: Mapping[Any, Any]) -> list[str]:
        problems = []
        for key, value in args.items():
            name = str(key)
            if name in self.set_by_us:
                problems.append(f"'{name}' is set by llgtriton prepare ({self.set_by_us[name]}); remove it")
            elif name not in self.kinds:
                problems.append(self._unknown(name))
            elif (problem := _value_problem(name, self.kinds[name], value)) is not None:
                problems.append(problem)
        return problems

    def _unknown(self, name: str) -> str:
        known = sorted(set(self.kinds) | set(self.set_by_us))
        wanted = name.lstrip("-").replace("-", "_")
        close = difflib.get_close_matches(wanted, known, n=3) or [k for k in known if k.startswith(wanted)][:3]
        guess = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        return f"unknown {self.label} argument '{name}'{guess}{self.hint}"

    def argv(self, args: Mapping[str, ArgValue]) -> list[str]:
        argv: list[str] = []
        for name, value in args.items():
            flag = f"--{name}"
            kind = self.kinds[name]
            if isinstance(value, list):
                argv += [flag, *value]
            elif isinstance(value, bool):
                if kind == "switch":
                    argv += [flag] if value else []
                elif kind == "feature":
                    argv += [flag, "enable" if value else "disable"]
                else:  # a plugin: only false passes validation
                    argv += [flag, "disable"]
            else:
                argv += [flag, str(value)]
        return argv


def _kinds(groups: Mapping[OptionKind, frozenset[str]]) -> dict[str, OptionKind]:
    return {name: kind for kind, names in groups.items() for name in names}


TRTLLM_BUILD = Tool(
    "trtllm-build",
    _kinds(
        {
            "switch": TRTLLM_BUILD_SWITCHES,
            "feature": TRTLLM_BUILD_FEATURES,
            "plugin": TRTLLM_BUILD_PLUGINS,
            "value": TRTLLM_BUILD_VALUES,
            "values": TRTLLM_BUILD_LISTS,
        }
    ),
    TRTLLM_BUILD_SET_BY_US,
)
CONVERT_CHECKPOINT = Tool(
    "convert_checkpoint.py",
    _kinds({"switch": CONVERT_SWITCHES, "value": CONVERT_VALUES}),
    CONVERT_SET_BY_US,
    hint="; a flag of one model family goes in build.convert.extra_args",
)


def _value_problem(name: str, kind: OptionKind, value: object) -> str | None:
    is_bool = isinstance(value, bool)
    is_scalar = isinstance(value, str | int | float) and not is_bool
    expected = {
        "switch": (is_bool, "true or false"),
        "feature": (is_bool or value in ("enable", "disable"), "true or false (or enable/disable)"),
        "plugin": (value is False or isinstance(value, str), "a dtype (auto, float16, bfloat16, ...) or false"),
        "value": (is_scalar, "a string or a number"),
        "values": (
            is_scalar or (isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)),
            "a string or a list of strings",
        ),
    }
    ok, what = expected[kind]
    return None if ok else f"'{name}' takes {what}, not {json.dumps(value, default=str)}"


def arguments_error(problems: list[str]) -> PydanticCustomError:
    return PydanticCustomError("llgtriton_arguments", "{problems}", {"problems": "\n".join(problems)})
