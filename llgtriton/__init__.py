"""llgtriton: OpenAI-compatible serving on Triton with guaranteed structured output.

This package holds what both sides share: the Triton wire contract (``wire``), the settings
(``settings``) and the launcher (``cli``, ``triton_server``). The two sides live in the
top-level packages ``proxy`` (OpenAI REST → Triton gRPC) and ``backend`` (the engine inside
Triton's python backend).
"""

__version__ = "0.1.0"
