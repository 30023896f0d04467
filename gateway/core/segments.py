"""Streamed model text cut into speakable segments, for a speech synthesizer (TTS).

A voice pipeline feeds the text deltas of one answer to a fresh ``Segmenter`` and hands
each segment it returns to the TTS at once: whole sentences, a clause when a sentence runs
long, and an early first clause so that audio starts soon::

    segmenter = Segmenter()
    for delta in deltas:
        for segment in segmenter.feed(delta):
            speak(segment)
    if (rest := segmenter.flush()) is not None:
        speak(rest)

Guarantees:

- The segments joined are the text, exactly. A segment keeps the whitespace after it, so
  a segment starts with a non-space character (but for whitespace at the start of the text
  or of a model step), and no segment is only whitespace. Text that is only whitespace
  gives no segment: ``flush`` returns None and keeps it, to go before the next segment if
  the instance is fed again (the next model step of the answer).
- The segments depend on the text only, not on how it was cut into deltas. A segment is
  returned by the ``feed`` that brings the lookahead its end needs: the first non-space
  character after it, a few more characters after a line break (is it a list item?), the
  end of a run of backticks. ``flush`` decides nothing that more text could have decided:
  it returns what is left, as one segment.
- Pure: no I/O, no clock. A delta costs about its length: the scan resumes where it
  stopped, re-reading only the lookahead it waited for, and at most ``max_chars``
  characters after a clause split.

Where a segment ends (the whitespace after the mark stays in the segment):

1. Sentence end: a run of ``. ! ? …`` (``?!`` and ``...`` are one end), any closing quotes
   or brackets, whitespace, then a character that can start a sentence: anything but a
   lowercase letter or one of ``, ; : ) ] } % …``. So there is no end inside numbers
   (``3.14``, ``$1,299.99``, ``10.5%``, ``v2.0.1``), URLs, e-mail addresses or file names
   (``example.com/a.b?c=d``, ``ada@example.org``, ``report.pdf``): no whitespace follows
   their dots; the dot after a URL, before a space, does end the sentence. Nor before a
   lowercase word: ``wait... what``, ``e.g. this``, ``the U.S. economy``. A single ``.``
   does not end a sentence after a word of ``ABBREVIATIONS`` (case-sensitive: ``Dr.``,
   ``vs.``, ``Jan.``, ...), a word of ``NUMBER_ABBREVIATIONS`` before a digit (``No. 5``;
   ``No. That's`` ends), an initial (one capital: ``J. R. R. Tolkien``), letters joined by
   dots (``U.S.``, ``a.m.``) or a number that starts its line (the list item ``1. First``).
   Such a word that really ends a sentence (``etc.`` at the end of one, before a capital)
   makes that segment run on to the next end: a late split, never a wrong one.
2. CJK sentence end: ``。！？`` (with the closing brackets after it), no whitespace needed.
3. Line: whitespace with two line breaks (a paragraph), or one before a list item or a
   heading (``- `` ``* `` ``+ `` ``• `` ``1. `` ``1) `` ``# ``).
4. Code: a run of three or more backticks that starts a line opens a fenced block. The
   text before it ends there, and the block, from its opening line through its closing
   line (and the whitespace after), is one segment, returned when it closes. Inside inline
   code (from a run of backticks to one as long, or to the end of the line) nothing ends.
5. Early first segment: until a first segment is returned, a clause boundary ends it once
   at least ``first_min_chars`` characters lead up to its mark: ``Sure, I can help with
   that,`` goes to the TTS while the model writes the rest. Clause boundaries: ``, ; :``
   and a spaced dash ``—`` or ``–``, each followed by whitespace; CJK ``，、；：``.
6. Long text: once the held text passes ``max_chars`` characters without an end above, the
   segment ends at the last clause boundary within the first ``max_chars`` characters,
   else at the last whitespace there, else (one long word, URL or code span) at the first
   boundary or whitespace after them. Text with neither (a long CJK run without
   punctuation) waits for its next mark; a fenced block is never cut.

A segment ends only after whitespace or punctuation, never before a combining mark, so a
grapheme (a ZWJ emoji sequence, a skin tone, a flag) is never split. An emoji after a
sentence end starts the next segment: ``Done! 🎉 Next`` gives ``Done! `` and ``🎉 Next``.
"""

# ruff: noqa: RUF001, RUF002 (the CJK and typographic punctuation here is the point)
from __future__ import annotations

import re
import sys
import unicodedata

__all__ = [
    "ABBREVIATIONS",
    "DEFAULT_FIRST_MIN_CHARS",
    "DEFAULT_MAX_CHARS",
    "NUMBER_ABBREVIATIONS",
    "Segmenter",
]

DEFAULT_MAX_CHARS = 160
DEFAULT_FIRST_MIN_CHARS = 24

ABBREVIATIONS = frozenset(
    {
        *("Dr", "Mr", "Mrs", "Ms", "Mx", "Prof", "Sr", "Jr", "St", "Mt", "Rev", "Hon"),
        *("Gen", "Col", "Lt", "Sgt", "Capt", "Gov", "Sen", "Rep", "Dept", "Ave", "Blvd"),
        *("Inc", "Ltd", "Co", "Corp", "Fig", "approx", "Approx", "vs", "etc", "cf", "al"),
        *("Jan", "Feb", "Mar", "Apr", "Jun", "Jul", "Aug", "Sep", "Sept", "Oct", "Nov", "Dec"),
    }
)
"""Words (without their dot) after which a single ``.`` never ends a sentence."""

NUMBER_ABBREVIATIONS = frozenset(
    {"No", "no", "Nos", "Nr", "nr", "Vol", "vol", "p", "pp", "Ch", "ch", "Art", "Sec", "Eq"}
)
"""Words (without their dot) after which ``.`` does not end a sentence before a digit."""

_ENDS = ".!?…。！？"
_CJK_ENDS = "。！？"
_CLOSERS = "\"'”’»›)]}」』）》】〉"
_OPENERS = "\"'“‘«‹([{「『（《【〈¿¡"
_CLAUSES = ",;:"
_DASHES = "—–"
_CJK_CLAUSES = "，、；："
_NOT_STARTERS = ",;:)]}%…"

# Where the scan stops: whitespace (most marks are judged from the whitespace after them,
# looking back), backticks, and the CJK marks that need no whitespace. No nested
# quantifiers anywhere, so no backtracking.
_TEXT_STOP = re.compile(r"[\s`。！？，、；：]")
_CODE_STOP = re.compile(r"[`\n]")
_NON_SPACE = re.compile(r"\S")
_DOTTED = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")
_LIST_ITEM = re.compile(r"(?:[-*+•]|#{1,6}|\d{1,9}[.)])[ \t]")
_LIST_ITEM_PREFIX = re.compile(r"[-*+•]|#{1,6}|\d{1,9}[.)]?")

_TEXT, _INLINE, _FENCE = 0, 1, 2
_WAIT, _GO = -1, 0
"""What a step of the scan found besides a cut (a position > 0): wait for more text, or go on."""
_SPACE, _CLAUSE, _SENTENCE = 0, 1, 2


def _extends(char: str) -> bool:
    """Whether ``char`` belongs to the grapheme before it (a segment never starts with it)."""
    if char < "\u0300":
        return False
    code = ord(char)
    return (
        code == 0x200D  # zero-width joiner
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0x1F3FB <= code <= 0x1F3FF  # skin tones
        or 0xE0020 <= code <= 0xE007F  # tag characters (subdivision flags)
        or unicodedata.category(char) in ("Mn", "Mc", "Me")
    )


def _list_item(text: str, at: int) -> bool | None:
    """Whether a list item or heading starts at ``at``; None while the text is too short."""
    if _LIST_ITEM.match(text, at):
        return True
    return None if _LIST_ITEM_PREFIX.fullmatch(text, at) else False


def _fence_close(text: str, at: int, length: int) -> int | None:
    """The line break ending the line at ``at`` if that line closes a fence of ``length``
    backticks, -1 if it does not, None while the text is too short to tell."""
    end = len(text)
    while at < end and text[at] in " \t":
        at += 1
    start = at
    while at < end and text[at] == "`":
        at += 1
    if at == end:
        return None
    if at - start < length:
        return -1
    while at < end and text[at] in " \t\r":
        at += 1
    if at == end:
        return None
    return at if text[at] == "\n" else -1


class Segmenter:
    """Cuts the streamed text of one answer into segments; see the module docstring."""

    __slots__ = (
        "_ahead",
        "_buf",
        "_clause",
        "_code_len",
        "_fence_line",
        "_first",
        "_first_min",
        "_line_start",
        "_max",
        "_mode",
        "_pos",
        "_space",
        "_word",
    )

    def __init__(
        self,
        *,
        max_chars: int | None = DEFAULT_MAX_CHARS,
        first_min_chars: int | None = DEFAULT_FIRST_MIN_CHARS,
    ) -> None:
        """Args:
        max_chars: Held text longer than this ends at a clause boundary or whitespace
            (rule 6). None disables the limit: a segment waits for a sentence end.
        first_min_chars: The first segment ends at a clause boundary with at least this
            many characters up to its mark (rule 5). None disables the early first segment.

        Raises:
            ValueError: ``max_chars`` below 1 or ``first_min_chars`` below 0.
        """
        if max_chars is not None and max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        if first_min_chars is not None and first_min_chars < 0:
            raise ValueError("first_min_chars must not be negative")
        self._max = sys.maxsize if max_chars is None else max_chars
        self._first_min = first_min_chars
        self._first = True
        self._buf = ""
        """The held text: from the end of the last segment to the end of the last delta."""
        self._line_start = True
        """Whether the held text starts a line."""
        self._reset()

    def _reset(self) -> None:
        """The scan state for held text that starts a segment."""
        self._pos = 0  # where the scan goes on
        self._mode = _TEXT
        self._code_len = 0  # the backticks that opened the code span or block
        self._fence_line = False  # whether _pos starts a line of a fenced block
        self._word = 0  # where the word being scanned starts
        self._clause = 0  # the cut after the last clause boundary (0: none yet)
        self._space = 0  # the cut after the last whitespace (0: none yet)
        self._ahead = 0  # the whitespace being waited on is known to go on to here

    def feed(self, delta: str) -> list[str]:
        """The segments that ``delta``, the next piece of the answer's text, completes."""
        if not delta:
            return []
        self._buf += delta
        segments: list[str] = []
        while (cut := self._scan()) is not None:
            segments.append(self._emit(cut))
        return segments

    def flush(self) -> str | None:
        """The rest of the text at the end of the answer (or of a model step), or None when
        nothing but whitespace is left; that whitespace stays for the next ``feed``."""
        if not self._buf or self._buf.isspace():
            return None
        return self._emit(len(self._buf))

    def _emit(self, cut: int) -> str:
        segment, self._buf = self._buf[:cut], self._buf[cut:]
        self._first = False
        self._line_start = segment.rstrip(" \t").endswith("\n")
        self._reset()
        return segment

    def _scan(self) -> int | None:
        """Where the next segment ends, or None until more text comes."""
        buf = self._buf
        size = len(buf)
        while True:
            pos = self._pos
            if self._mode == _FENCE:  # the block is one segment: only its closing line matters
                if self._fence_line:
                    close = _fence_close(buf, pos, self._code_len)
                    if close is None:
                        return None
                    if close >= 0:
                        after = _NON_SPACE.search(buf, close)
                        return None if after is None else after.start()
                    self._fence_line = False
                newline = buf.find("\n", pos)
                if newline < 0:
                    self._pos = size
                    return None
                self._pos, self._fence_line = newline + 1, True
                continue
            stop = (_TEXT_STOP if self._mode == _TEXT else _CODE_STOP).search(buf, pos)
            at = size if stop is None else stop.start()
            if at > self._max and (fallback := self._clause or self._space):
                return fallback
            if stop is None:
                self._pos = size
                return None
            char = buf[at]
            if self._mode == _INLINE:
                step = self._code(at)
            elif char == "`":
                step = self._backtick(at)
            elif char in _CJK_ENDS:
                step = self._cjk_mark(at, sentence=True)
            elif char in _CJK_CLAUSES:
                step = self._cjk_mark(at, sentence=False)
            else:
                step = self._whitespace(at)
            if step == _WAIT:
                self._pos = at
                return None
            if step != _GO:
                return step

    def _whitespace(self, at: int) -> int:
        """A step at the whitespace run starting at ``at``: judge the mark before it."""
        buf = self._buf
        after = _NON_SPACE.search(buf, max(at, self._ahead))
        if after is None:
            self._ahead = len(buf)  # so that a long run fed bit by bit is read once
            return _WAIT
        cut = after.start()
        if at == 0:  # leading whitespace of the answer
            self._pos = self._word = cut
            return _GO
        breaks = buf.count("\n", at, cut)
        if breaks >= 2:
            return cut
        if breaks == 1:
            item = _list_item(buf, cut)
            if item is None:
                return _WAIT
            if item:
                return cut
        if _extends(buf[cut]):
            self._pos = cut
            return _GO
        kind = self._mark_before(at, cut)
        if kind == _SENTENCE:
            return cut
        return self._weak(kind == _CLAUSE, at, cut)

    def _mark_before(self, at: int, cut: int) -> int:
        """What ends at ``at``, where whitespace starts: a sentence, a clause or a word."""
        buf = self._buf
        end = at
        while end > 0 and buf[end - 1] in _CLOSERS:
            end -= 1
        if end == 0:
            return _SPACE
        mark = buf[end - 1]
        if mark in _ENDS:
            start = end - 1
            while start > 0 and buf[start - 1] in _ENDS:
                start -= 1
            return _SENTENCE if self._ends_sentence(start, end, buf[cut]) else _SPACE
        if mark in _CLAUSES or (mark in _DASHES and end >= 2 and buf[end - 2].isspace()):
            return _CLAUSE
        return _SPACE

    def _ends_sentence(self, start: int, end: int, following: str) -> bool:
        """Whether the run of end marks ``buf[start:end]`` ends a sentence before
        ``following``, the next non-space character."""
        if following.islower() or following in _NOT_STARTERS:
            return False
        buf = self._buf
        if end - start > 1 or buf[start] != ".":
            return True
        word = buf[self._word : start].lstrip(_OPENERS)
        if word in ABBREVIATIONS or _DOTTED.fullmatch(word):
            return False
        if len(word) == 1 and word.isupper():  # an initial
            return False
        if word in NUMBER_ABBREVIATIONS and following.isdigit():
            return False
        return not (word.isdigit() and self._starts_line(self._word))

    def _starts_line(self, at: int) -> bool:
        buf = self._buf
        while at > 0 and buf[at - 1] in " \t":
            at -= 1
        return self._line_start if at == 0 else buf[at - 1] == "\n"

    def _weak(self, clause: bool, mark: int, cut: int) -> int:
        """A step at a clause boundary or whitespace ending at ``mark``, cut at ``cut``:
        rules 5 and 6."""
        self._pos = self._word = cut
        if clause:
            first_min = self._first_min
            if self._first and first_min is not None and mark >= first_min:
                return cut
            self._clause = cut
        else:
            self._space = cut
        if mark >= self._max:
            return self._clause or self._space
        return _GO

    def _cjk_mark(self, at: int, *, sentence: bool) -> int:
        """A step at a CJK sentence end or clause mark, which needs no whitespace."""
        buf = self._buf
        size = len(buf)
        end = at + 1
        while sentence and end < size and buf[end] in _ENDS:
            end += 1
        while end < size and buf[end] in _CLOSERS:
            end += 1
        after = _NON_SPACE.search(buf, max(end, self._ahead))
        if after is None:
            self._ahead = size
            return _WAIT
        cut = after.start()
        if cut == end and _extends(buf[end]):
            self._pos = end
            return _GO
        if sentence:
            return cut
        return self._weak(True, end, cut)

    def _backtick(self, at: int) -> int:
        """A step at a run of backticks in text: a fenced block or inline code opens."""
        buf = self._buf
        end = at + 1
        while end < len(buf) and buf[end] == "`":
            end += 1
        if end == len(buf):
            return _WAIT
        if end - at >= 3 and self._starts_line(at):
            if at > 0 and not buf[:at].isspace():
                return at  # the text before the block is a segment of its own
            self._mode, self._fence_line = _FENCE, False
        else:
            self._mode = _INLINE
        self._code_len = end - at
        self._pos = end
        return _GO

    def _code(self, at: int) -> int:
        """A step in inline code, at a backtick or line break: does the code end here?"""
        buf = self._buf
        if buf[at] == "\n":  # an unclosed span ends with its line
            self._mode, self._pos = _TEXT, at
            return _GO
        end = at + 1
        while end < len(buf) and buf[end] == "`":
            end += 1
        if end == len(buf):
            return _WAIT
        if end - at == self._code_len:
            self._mode = _TEXT
        self._pos = end
        return _GO
