"""StopStringFilter: text is cut before the first stop string, and no stop string ever leaks out."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from backend.stop_strings import StopStringFilter

# A small alphabet makes stops occur often; it has 1-, 2-, 3- and 4-byte UTF-8 characters.
ALPHABET = "abé€😀"
texts = st.text(alphabet=ALPHABET, max_size=30)
stop_lists = st.lists(st.text(alphabet=ALPHABET, max_size=4), max_size=4)


@dataclass
class Run:
    emitted: list[str]  # what each push released, in order
    stopped_at: int | None  # index of the push that reported a stop
    flushed: str  # what flush() released (only called when no stop was found)

    @property
    def text(self) -> str:
        return "".join(self.emitted) + self.flushed


def _run(stops: list[str], chunks: list[str]) -> Run:
    stop_filter = StopStringFilter(stops)
    emitted: list[str] = []
    for index, chunk in enumerate(chunks):
        text, stopped = stop_filter.push(chunk)
        emitted.append(text)
        if stopped:
            return Run(emitted, index, "")
    return Run(emitted, None, stop_filter.flush())


def _earliest_stop(text: str, stops: list[str]) -> int | None:
    hits = [index for index in (text.find(stop) for stop in stops if stop) if index >= 0]
    return min(hits) if hits else None


def _cut(text: str, stops: list[str]) -> str:
    index = _earliest_stop(text, stops)
    return text if index is None else text[:index]


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    return max(
        (n for stop in stops for n in range(1, len(stop)) if text.endswith(stop[:n])),
        default=0,
    )


@st.composite
def chunkings(draw: st.DrawFn) -> tuple[str, list[str]]:
    text = draw(texts)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return text, [text[start:end] for start, end in itertools.pairwise(bounds)]


def _interior_containment(stops: list[str]) -> bool:
    """Whether some stop occurs strictly inside another (neither at its start nor at its end).

    Then a streaming filter meets the inner stop complete before it can know whether the outer
    one (which starts earlier) will complete; it must stop on the inner one.
    """
    return any(inner and inner in outer[1:-1] for inner in stops for outer in stops if inner != outer)


PROPERTY = settings(deadline=None, max_examples=300)


@PROPERTY
@given(chunkings(), stop_lists)
@example(("xyzabcd", ["xyza", "bcd"]), ["abcd", "bc"])
@example(("ab😀é", ["a", "b😀", "é"]), ["😀é", "b😀é", "😀"])
def test_output_is_the_text_up_to_the_first_stop_for_any_chunking(
    chunking: tuple[str, list[str]], stops: list[str]
) -> None:
    text, chunks = chunking
    run = _run(stops, chunks)
    if run.stopped_at is None:
        # No stop anywhere: everything comes out, exactly once, in order.
        assert _earliest_stop(text, stops) is None
        assert run.text == text
        return
    # The filter stops on the chunk with which a stop string first appears ...
    seen = "".join(chunks[: run.stopped_at + 1])
    assert _earliest_stop(seen, stops) is not None
    assert _earliest_stop("".join(chunks[: run.stopped_at]), stops) is None
    # ... and emits what was generated up to then, cut before its earliest stop string.
    assert run.text == _cut(seen, stops)


@PROPERTY
@given(chunkings(), stop_lists.filter(lambda stops: not _interior_containment(stops)))
@example(("abcab", ["ab", "ca", "b"]), ["abc", "ca", "c"])
@example(("a€€b", ["a€", "€b"]), ["€€", "a€€"])
def test_output_is_the_text_cut_before_the_earliest_stop(chunking: tuple[str, list[str]], stops: list[str]) -> None:
    """Unless a stop sits strictly inside another one, the result does not depend on the chunking."""
    text, chunks = chunking
    run = _run(stops, chunks)
    assert run.text == _cut(text, stops)
    assert (run.stopped_at is not None) == (_earliest_stop(text, stops) is not None)


@PROPERTY
@given(chunkings(), stop_lists)
def test_no_stop_string_is_ever_emitted_and_nothing_is_held_longer_than_needed(
    chunking: tuple[str, list[str]], stops: list[str]
) -> None:
    text, chunks = chunking
    run = _run(stops, chunks)
    emitted = ""
    for index, part in enumerate(run.emitted):
        emitted += part
        assert text.startswith(emitted)  # only text that was generated, in order
        assert _earliest_stop(emitted, stops) is None  # never any stop string, even transiently
        if index != run.stopped_at:
            # Everything is released except a tail that could still become a stop string.
            seen = "".join(chunks[: index + 1])
            assert emitted == seen[: len(seen) - _held_back(seen, [s for s in stops if s])]


@PROPERTY
@given(texts, st.lists(st.integers(0, 30), max_size=8))
def test_without_stop_strings_text_passes_straight_through(text: str, cuts: list[int]) -> None:
    bounds = [0, *sorted(min(c, len(text)) for c in cuts), len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    for stops in ([], [""], ["", ""]):
        run = _run(stops, chunks)
        assert run.emitted == chunks
        assert run.stopped_at is None
        assert run.flushed == ""


# Readable examples --------------------------------------------------------------------------


def test_stop_split_across_chunks_is_never_emitted() -> None:
    stop_filter = StopStringFilter(["</answer>"])
    assert stop_filter.push("The answer is 42</") == ("The answer is 42", False)
    assert stop_filter.push("ans") == ("", False)
    assert stop_filter.push("wer> and more") == ("", True)


def test_held_text_is_released_by_flush() -> None:
    stop_filter = StopStringFilter(["\n\nUser:"])
    assert stop_filter.push("Bye.\n") == ("Bye.", False)
    assert stop_filter.flush() == "\n"
    assert stop_filter.flush() == ""


def test_held_text_that_turns_out_not_to_be_a_stop_is_released() -> None:
    stop_filter = StopStringFilter(["STOP"])
    assert stop_filter.push("ST") == ("", False)
    assert stop_filter.push("ART now") == ("START now", False)


def test_earliest_of_several_stops_wins() -> None:
    stop_filter = StopStringFilter(["world", "lo"])
    assert stop_filter.push("hello world") == ("hel", True)


def test_stop_with_multibyte_characters() -> None:
    stop_filter = StopStringFilter(["😀€"])
    assert stop_filter.push("café 😀") == ("café ", False)
    assert stop_filter.push("€ trailing") == ("", True)


def test_stop_at_the_very_start_emits_nothing() -> None:
    assert StopStringFilter(["###"]).push("### heading") == ("", True)


# Stop strings where a grammar decides (may_stop) ----------------------------------------------


def _even_as(text: str) -> bool:
    """A stand-in for a grammar: the output may end only after an even number of "a"s."""
    return text.count("a") % 2 == 0


def _run_deciding(stops: list[str], chunks: list[str]) -> Run:
    stop_filter = StopStringFilter(stops)
    emitted: list[str] = []
    stop_filter.may_stop = lambda before: _even_as("".join(emitted) + before)
    for index, chunk in enumerate(chunks):
        text, stopped = stop_filter.push(chunk)
        emitted.append(text)
        if stopped:
            return Run(emitted, index, "")
    return Run(emitted, None, stop_filter.flush())


def _cut_where_allowed(text: str, stops: list[str]) -> str:
    ends = sorted(i for stop in stops if stop for i in range(len(text)) if text.startswith(stop, i))
    allowed = [i for i in ends if _even_as(text[:i])]
    return text[: allowed[0]] if allowed else text


@PROPERTY
@given(chunkings(), stop_lists.filter(lambda stops: not _interior_containment(stops)))
@example(("xabab", ["xab", "ab"]), ["ab"])
@example(("aabab", ["a", "abab"]), ["ab", "ba"])
def test_a_stop_string_ends_the_output_only_where_the_decider_allows(
    chunking: tuple[str, list[str]], stops: list[str]
) -> None:
    """Elsewhere it is text, released like any other: the output is the text cut at the first
    occurrence the decider accepts, whatever the chunking."""
    text, chunks = chunking
    run = _run_deciding(stops, chunks)
    assert run.text == _cut_where_allowed(text, stops)


def test_a_refused_stop_string_is_released_as_text() -> None:
    """``may_stop`` sees the text before the stop string in this push's buffer; the caller adds the rest."""
    stop_filter = StopStringFilter(["}"])
    stop_filter.may_stop = lambda before: before == '{"a": {"b": 1}'  # the outer brace still to come
    assert stop_filter.push('{"a": {"b": 1}}, "c"') == ('{"a": {"b": 1}', True)
    stop_filter = StopStringFilter(["}"])
    stop_filter.may_stop = lambda before: False
    assert stop_filter.push('{"a": 1}') == ('{"a": 1}', False)
