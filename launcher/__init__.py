"""The launcher: the ``llgtriton`` command (``serve``, ``proxy``, ``prepare``) and Triton's process.

It stands on top of both sides: it starts Triton (whose python backend runs ``backend``) and the
proxy's worker processes, and prepares model folders. Nothing imports it but its entry points.
"""
