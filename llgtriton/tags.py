"""Tags in streamed text: how much of a text's end may still become one, and must be held back."""

from __future__ import annotations


def partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` without being all of it."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
