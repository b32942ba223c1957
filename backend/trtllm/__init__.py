"""The TensorRT-LLM engine (``engine = "trtllm"``), written against TensorRT-LLM 1.2.x.

A Hugging Face checkpoint runs through the LLM API (PyTorch backend, :mod:`backend.trtllm.llm_api`);
a prebuilt TensorRT engine runs through the executor bindings (:mod:`backend.trtllm.executor`).
Both attach our logits post-processors (:mod:`backend.trtllm.hooks`) and share the request
bookkeeping in :mod:`backend.trtllm.runs`. TensorRT-LLM is imported only when this engine starts.
"""
