"""llgtriton: OpenAI-compatible serving on Triton with guaranteed structured output.

This package is the ground both sides stand on, and imports neither: the Triton wire contract
(``wire``), the constraint formats (``guides``), the settings (``settings``), logging (``logs``) and
the prepared-model folder (``prepared``). The sides are the top-level packages ``proxy`` (OpenAI
REST to Triton gRPC) and ``backend`` (the engine inside Triton's python backend); ``launcher``
starts them. ``tests/test_layout.py`` keeps it so.
"""

__version__ = "0.1.0"
