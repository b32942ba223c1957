"""lm-eval's ``local-completions`` on a small multiple-choice task shipped here: every choice is scored
with ``echo``, ``logprobs`` and ``max_tokens: 1``, so the server must return the prompt's own logprobs."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the task's data and the tokenizer are local
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
import lm_eval
from lm_eval.tasks import TaskManager

QUESTIONS = [
    {"question": "What color is the sky on a clear day?", "choices": ["blue", "green", "purple"], "answer": 0},
    {"question": "How many legs does a dog have?", "choices": ["two", "four", "eight"], "answer": 1},
    {"question": "What is the capital of France?", "choices": ["Berlin", "Madrid", "Paris"], "answer": 2},
    {"question": "Which animal says moo?", "choices": ["cow", "cat", "duck"], "answer": 0},
]
TASK = """task: llgtriton_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def test_multiple_choice(base_url: str, model: str, tokenizer_path: str, tmp_path: Path) -> None:
    data = tmp_path / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps(question) + "\n" for question in QUESTIONS))
    (tmp_path / "tiny_mc.yaml").write_text(TASK.format(data=data))
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "model": model,
            "base_url": f"{base_url}/completions",
            "tokenizer": tokenizer_path,
            "tokenizer_backend": "huggingface",
            "num_concurrent": 2,
            "max_retries": 1,
        },
        tasks=["llgtriton_tiny_mc"],
        task_manager=TaskManager(include_path=str(tmp_path)),
    )
    assert results is not None
    accuracy = results["results"]["llgtriton_tiny_mc"]["acc,none"]
    assert 0.0 <= accuracy <= 1.0 and not math.isnan(accuracy)
    samples = results["samples"]["llgtriton_tiny_mc"]
    assert len(samples) == len(QUESTIONS)
    for sample in samples:  # each choice got a finite log likelihood from the prompt's own logprobs
        scores = [float(loglikelihood) for loglikelihood, _ in sample["filtered_resps"]]
        assert len(scores) == 3 and all(math.isfinite(score) and score < 0 for score in scores)
