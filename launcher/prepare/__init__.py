"""``llgtriton prepare``: turn a Hugging Face model into a folder the TensorRT-LLM engine serves.

    llgtriton prepare ./Llama-3.1-8B-Instruct ./prepared      # served by the LLM API (PyTorch backend)
    llgtriton prepare --config prepare.toml                    # with [build], a TensorRT engine
    llgtriton prepare --config prepare.toml --dry-run          # print the steps, change nothing

The output folder is the contract with the backend: :mod:`llgtriton.prepared` describes it. By job:
``config`` (the TOML file and the arguments), ``arguments`` (the TensorRT-LLM tools' arguments),
``files`` (the source's checks and the file moves), ``plan`` (the steps, and running them),
``command`` (the entry point).

Pure Python: nothing here imports torch, transformers or tensorrt_llm (it runs in the slim image
too). The engine build runs TensorRT-LLM's own ``convert_checkpoint.py`` and ``trtllm-build`` as
subprocesses. Relative paths are relative to the current directory.
"""

from launcher.prepare.command import add_prepare_arguments, prepare_main
from launcher.prepare.config import PrepareConfig, load_prepare_config
from launcher.prepare.plan import Step, plan, prepare

__all__ = ["PrepareConfig", "Step", "add_prepare_arguments", "load_prepare_config", "plan", "prepare", "prepare_main"]
