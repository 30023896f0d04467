"""What a durable commit takes, and when it saves the session's whole state.

A session's driver commits the effects of the events it applied to the store in batches
(``gateway.shell.journal``), and carries them out only once they are committed. This is
the pure part of that policy:

- what a batch is (``split_batch``): the effects of the events applied since the last
  commit, in order. The commit takes the events to send among them, each with its encoding,
  and the calls to save; the other effects (a model step, a tool) wait for it.
- when a commit saves the whole state, with a durable store (``Checkpoints``): not when
  every event since the last one only added to the log (text deltas of the streaming step,
  pongs, errors about unreadable frames), as a node taking the session over catches up from
  the log (``Session.catch_up``); but at least every ``CHECKPOINT_EVENTS`` events or
  ``CHECKPOINT_SIZE`` bytes of them. And so how far an ack may trim the log: never past
  the last state saved.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.call import Call
from gateway.core.event import Effect, Event, ModelOutput, SaveCall, Send
from gateway.core.model import ModelText
from gateway.core.outbound import ServerMsg
from gateway.core.session import LOG_ONLY

__all__ = ["CHECKPOINT_EVENTS", "CHECKPOINT_SIZE", "Checkpoints", "Sends", "split_batch"]


CHECKPOINT_EVENTS = 256
CHECKPOINT_SIZE = 64 * 2**10
"""With a durable store, the whole state is saved at least every this many events or
bytes of events even while a stream only adds text (see ``Checkpoints``); far below the
log's own bounds, so the log always has what came after it."""

Sends = list[tuple[ServerMsg, bytes]]
"""The events a batch sends, each with its encoding."""


def split_batch(
    effects: list[Effect], encode: Callable[[ServerMsg], bytes]
) -> tuple[Sends, list[Call]]:
    """What a commit takes of a batch of ``effects``: the events to send, each encoded
    once (the log and the socket get the same bytes), and the calls to save. The other
    effects are carried out once the commit is done."""
    sends: Sends = []
    calls: list[Call] = []
    for effect in effects:
        if type(effect) is Send:
            sends.append((effect.msg, encode(effect.msg)))
        elif type(effect) is SaveCall:
            calls.append(effect.call)
    return sends, calls


class Checkpoints:
    """When a commit saves the session's whole state, and how far the log may be trimmed.

    With a durable store, every commit saves the whole state but one whose events only
    add to the log. So a long stream costs a state write every ``CHECKPOINT_EVENTS``
    events or ``CHECKPOINT_SIZE`` bytes, not at every batch, a ping costs no state write,
    and the log keeps what was sent since the last one. Without a durable store (one node)
    no commit saves it and the log is trimmed as far as the client acks.

    Args:
        durable: the store keeps the state for another node to take the session over.
        saved_seq: the ``seq`` of the state the store has.
        log_only: every event applied since that state only added to the log (not so for
            a session caught up from the log since: that goes into its state at once).
    """

    __slots__ = ("_durable", "_events", "_log_only", "_size", "saved_seq")

    def __init__(self, *, durable: bool, saved_seq: int, log_only: bool = True) -> None:
        self._durable = durable
        self.saved_seq = saved_seq
        """The ``seq`` of the last state the store took: the log keeps every event after
        it (a node taking the session over catches up from there)."""
        self._log_only = log_only
        self._events = 0
        self._size = 0

    def applied(self, event: Event) -> None:
        """``event`` was applied to the session: unless it only added to the log, the
        next commit saves the state."""
        if not (
            isinstance(event, LOG_ONLY)
            or (isinstance(event, ModelOutput) and isinstance(event.event, ModelText))
        ):
            self._log_only = False

    @property
    def log_only(self) -> bool:
        """Every event applied since the last commit only added to the log."""
        return self._log_only

    def changed(self) -> None:
        """The state changed beyond what the log says (the core failed on an event, a
        commit was lost): the next commit saves it."""
        self._log_only = False

    def saves_state(self, sends: Sends) -> bool:
        """Whether the commit of a batch that sends ``sends`` saves the whole state (it
        is counted as committed: the next batch starts afresh)."""
        log_only, self._log_only = self._log_only, True
        if not self._durable:
            return False
        self._events += len(sends)
        self._size += sum(len(data) for _, data in sends)
        if log_only and self._events < CHECKPOINT_EVENTS and self._size < CHECKPOINT_SIZE:
            return False
        self._events = self._size = 0
        return True

    def saved(self, seq: int) -> None:
        """The store took the state as of ``seq``."""
        self.saved_seq = seq

    def trim_bound(self, upto_seq: int) -> int:
        """How far the log may be trimmed once the client has every event up to
        ``upto_seq``: with a durable store, not past the last state saved (a node taking
        the session over needs what came after it)."""
        return min(upto_seq, self.saved_seq) if self._durable else upto_seq
