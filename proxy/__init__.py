"""The OpenAI-compatible HTTP proxy: OpenAI REST/SSE in, Triton gRPC streaming out.

Never imports torch or the ``backend`` package; talks to the backend only through the wire
contract in ``llgtriton.wire``.
"""
