"""The reasoning format the backend names in its first response, for splitting the output into its
thinking (``reasoning_content``) and its answer (``llgtriton.reasoning.ReasoningSplitter``)."""

from __future__ import annotations

from llgtriton.reasoning import REASONING_FORMATS, ReasoningFormat
from proxy.errors import InternalError


def reasoning_format(name: str) -> ReasoningFormat | None:
    """The format a backend says the output's thinking is in; None when it says none."""
    if not name:
        return None
    form = REASONING_FORMATS.get(name)
    if form is None:
        raise InternalError(f"the backend wrote reasoning in an unknown format {name!r}")
    return form
