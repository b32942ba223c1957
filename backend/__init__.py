"""The serving backend: engines, the step scheduler and the logits post-processor hook.

Runs inside Triton's python backend stub (``model_repository/llm/1/model.py`` is the adapter);
never imports Starlette or Triton's ``triton_python_backend_utils``.
"""
