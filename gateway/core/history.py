"""The transcript a session keeps and sends to the model, cut to a budget of characters.

Part of the pure session core. Items are grouped in turns: a turn is one response with
everything that led to it and answered it (the user's words, or the async results that
started it, the context that arrived before, the model's steps, the tool calls and their
outcomes). Before each model request ``History.trim`` drops the oldest whole turns until
the rest fits ``max_chars``. It never drops the turn in progress, and never keeps a tool
outcome whose call it dropped (model APIs reject an orphan result; a call without its
result cannot happen, since only a prefix is dropped). A turn in progress that alone is
over the budget is sent whole: cutting inside it would break a call from its result or
the model's view of what the user asked.

Size is measured as characters of text (user words, assistant text, context notes, tool
errors) plus bytes of the JSON of tool arguments and outputs.

``truncate_last_turn`` cuts the model's text in the turn in progress (or the last one) to
what the user heard when they interrupted a spoken answer (``response.truncate``), so that
the model does not believe it said what was never heard.
"""

from __future__ import annotations

import bisect
from typing import Any

import msgspec

from gateway.core.transcript import AssistantTurn, ContextNote, Item, ToolOutcome, UserTurn

__all__ = ["History", "Mark", "item_size", "items_size"]

Mark = tuple[int, int, int]
"""Where the transcript stood (``History.mark``): its first and end item, counted from the
first item the object held, and how many times items already kept were rewritten."""


class History:
    """The items of a session's conversation, in turns, within ``max_chars``.

    Args:
        max_chars: the budget ``trim`` cuts to; ``None`` keeps everything.
    """

    def __init__(self, max_chars: int | None = None) -> None:
        self._max_chars = max_chars
        self._items: list[Item] = []
        self._sizes: list[int] = []
        self._turn_starts: list[int] = []
        """Index of each turn's first item, oldest first."""
        self._size = 0
        self._dropped = 0
        """Items ``trim`` dropped so far (since this object was made or restored)."""
        self._rewrites = 0
        """Times items already kept were changed (``truncate_last_turn``)."""

    @property
    def items(self) -> tuple[Item, ...]:
        return tuple(self._items)

    @property
    def size(self) -> int:
        """The measure the budget applies to, over every item kept."""
        return self._size

    @property
    def turns(self) -> int:
        return len(self._turn_starts)

    @property
    def mark(self) -> Mark:
        """Where the items kept stand in the conversation (see ``Mark``); ``since`` tells a
        store what changed after a mark."""
        return self._dropped, self._dropped + len(self._items), self._rewrites

    def since(self, mark: Mark) -> tuple[int, list[Item]]:
        """What changed after ``mark``: how many of the items then kept were dropped since
        (from the front), and the items added since that are still kept. After a rewrite,
        every item then kept is dropped and every item now kept is added."""
        first, end, rewrites = mark
        if rewrites != self._rewrites:
            return end - first, list(self._items)
        now_first = self._dropped
        drop = min(now_first, end) - first
        start = max(end, now_first)
        return drop, self._items[start - now_first :]

    @property
    def turn_starts(self) -> list[int]:
        """Where each turn starts in ``items``, oldest first (a copy)."""
        return list(self._turn_starts)

    @classmethod
    def restore(cls, max_chars: int | None, items: list[Item], turn_starts: list[int]) -> History:
        """The history ``items`` and ``turn_starts`` describe (a ``SessionState``'s)."""
        history = cls(max_chars)
        history.extend(items)
        history._turn_starts = list(turn_starts)
        return history

    def begin_turn(self) -> None:
        """Items appended from now on belong to a new turn (the turn in progress)."""
        if not self._turn_starts or self._turn_starts[-1] != len(self._items):
            self._turn_starts.append(len(self._items))

    def append(self, item: Item) -> None:
        if not self._turn_starts:
            self._turn_starts.append(0)
        self._items.append(item)
        size = item_size(item)
        self._sizes.append(size)
        self._size += size

    def extend(self, items: list[Item] | tuple[Item, ...]) -> None:
        for item in items:
            self.append(item)

    def last_turn_text(self) -> str:
        """The model's text in the last turn, its steps' texts joined (what
        ``truncate_last_turn`` counts in)."""
        start = self._turn_starts[-1] if self._turn_starts else 0
        return "".join(item.text for item in self._items[start:] if isinstance(item, AssistantTurn))

    def truncate_last_turn(self, chars: int) -> bool:
        """Keep only the first ``chars`` characters of the model's text in the last turn
        (its steps' texts taken in order, as the client got them); its tool calls and
        outcomes stay. Whether anything changed."""
        start = self._turn_starts[-1] if self._turn_starts else 0
        left, changed = chars, False
        for index in range(start, len(self._items)):
            item = self._items[index]
            if not isinstance(item, AssistantTurn):
                continue
            kept = item.text[: max(left, 0)]
            left -= len(item.text)
            if kept != item.text:
                self._items[index] = msgspec.structs.replace(item, text=kept)
                size = item_size(self._items[index])
                self._size += size - self._sizes[index]
                self._sizes[index] = size
                changed = True
        self._rewrites += changed
        return changed

    def trim(self) -> int:
        """Drop the oldest whole turns until the rest fits the budget.

        Returns:
            How many items were dropped.
        """
        if self._max_chars is None or self._size <= self._max_chars:
            return 0
        cut = self._cut()
        if cut == 0:
            return 0
        del self._items[:cut]
        self._dropped += cut
        self._size -= sum(self._sizes[:cut])
        del self._sizes[:cut]
        self._turn_starts = [start - cut for start in self._turn_starts if start >= cut]
        return cut

    def _cut(self) -> int:
        """Where the kept items start: the oldest turn start past which the rest fits,
        else the turn in progress (the newest safe turn start)."""
        assert self._max_chars is not None
        unsafe = self._unsafe_cuts()
        # Candidates: every turn start but the first (cutting there drops nothing).
        candidates = [start for start in self._turn_starts[1:] if start not in unsafe]
        if not candidates:
            return 0
        rest = self._size
        dropped_upto = 0
        for start in candidates:
            rest -= sum(self._sizes[dropped_upto:start])
            dropped_upto = start
            if rest <= self._max_chars:
                return start
        return candidates[-1]

    def _unsafe_cuts(self) -> set[int]:
        """Turn starts that fall between a tool call and its outcome."""
        requested: dict[str, int] = {}
        unsafe: set[int] = set()
        starts = self._turn_starts
        for index, item in enumerate(self._items):
            if isinstance(item, AssistantTurn):
                for call in item.calls:
                    requested[call.call_id] = index
            elif isinstance(item, ToolOutcome) and item.call_id in requested:
                # Cutting at any turn start in (call, outcome] would orphan the outcome.
                low = bisect.bisect_right(starts, requested[item.call_id])
                unsafe.update(starts[low : bisect.bisect_right(starts, index)])
        return unsafe


def item_size(item: Item) -> int:
    """Characters of text plus bytes of JSON of arguments and outputs (see the module)."""
    match item:
        case UserTurn(text=text) | ContextNote(text=text):
            return len(text)
        case AssistantTurn(text=text, calls=calls):
            return len(text) + sum(_json_size(call.args) for call in calls)
        case ToolOutcome(output=output, error=error):
            return _json_size(output) + len(error or "")
    return 0  # pragma: no cover - Item is exhaustive


def items_size(items: list[Item] | tuple[Item, ...]) -> int:
    """``item_size`` summed: the size of what a model request carries as history."""
    return sum(item_size(item) for item in items)


def _json_size(value: Any) -> int:
    try:
        return len(msgspec.json.encode(value))
    except (TypeError, msgspec.EncodeError):
        return len(str(value))
