"""Every started response ends, whatever the session core raises and wherever.

The core is driven as the driver drives it (``Session.receive``, and ``Session.recover``
when it raises: ``Driver._receive``). A conversation with a queued message, a client
call and two responses is played once cleanly, to count the effects the core emits; then
once for each of them with that one effect raising instead (``Outbox.send`` or ``do``
failing at its k-th call): a failure before, inside or after ``_start_step``, at the end
of one response with the next already queued, in a tool's settlement. Each run must end
every ``response.created`` with exactly one ``response.done``, report the failure once
(``internal``, naming the response and the message it answers), and answer a message sent
afterwards normally.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from gateway.core.event import Event, Send
from gateway.core.model import ModelFinish, ModelText
from gateway.core.outbox import Outbox
from gateway.wire.v1 import (
    Error,
    ResponseCreated,
    ResponseDone,
    ServerMsg,
    ToolCalls,
    ToolResult,
    ToolResults,
    UserMessage,
)
from tests.support import serving, session
from tests.test_session import Harness, lamp_call


class Injected(Exception):
    """The failure the test injects."""


class RecoveringHarness(Harness):
    """``Harness``, with the driver's rule: an event the core raises on is recovered."""

    def feed(self, event: Event) -> list[ServerMsg]:
        original = self.session.receive

        def receive(event: Event, *, now: float) -> None:
            try:
                original(event, now=now)
            except Injected:
                self.session.recover(event, now=now)

        self.session.receive = receive  # type: ignore[method-assign]
        try:
            return super().feed(event)
        finally:
            del self.session.receive


def conversation(h: RecoveringHarness) -> None:
    """Two messages (the second queued behind the first), a client call, two steps."""
    h.feed(UserMessage(text="lamp on", id="m1"))
    h.feed(UserMessage(text="second", id="m2"))
    sent = h.model(ModelText("Switching "), lamp_call(), ModelFinish())
    calls = [m for m in sent if isinstance(m, ToolCalls)]
    for batch in calls:
        for call in batch.calls:
            result = ToolResult(call_id=call.call_id, tool="lamp", output={"ok": 1})
            h.feed(ToolResults(results=[result]))
    h.model(ModelText("done."), ModelFinish())  # the first's second step, or the second's
    h.model(ModelText("and the second."), ModelFinish())
    h.model(ModelText("anything left."), ModelFinish())


def failing(
    at: int, lost: list[Any] | None = None
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``Outbox.send`` and ``Outbox.do`` that raise ``Injected`` at the ``at``-th effect
    counted over both (from 1), once, instead of emitting it (into ``lost``)."""
    send, do = Outbox.send, Outbox.do
    count = 0

    def counted(real: Callable[..., None]) -> Callable[..., None]:
        def effect(self: Outbox, item: Any) -> None:
            nonlocal count
            count += 1
            if count == at:
                if lost is not None:
                    lost.append(item)
                raise Injected(f"effect {at}")
            real(self, item)

        return effect

    return counted(send), counted(do)


def clean_run() -> RecoveringHarness:
    h = RecoveringHarness()
    h.start()
    conversation(h)
    return h


def effects_of_a_clean_run() -> int:
    """The effects the conversation emits after the session's start (each is a point of
    failure); counted by the same patch that injects them."""
    send, do = failing(0)  # counts, never fails
    counted: list[None] = []

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def effect(self: Outbox, item: Any) -> None:
            counted.append(None)
            real(self, item)

        return effect

    h = RecoveringHarness()
    h.start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Outbox, "send", counting(send))
        patch.setattr(Outbox, "do", counting(do))
        conversation(h)
    return len(counted)


EFFECTS = effects_of_a_clean_run()


def test_the_clean_run_has_two_whole_responses_and_a_client_call():
    h = clean_run()
    done = [(m.status, m.response_id) for m in h.sent if isinstance(m, ResponseDone)]
    created = [m.response_id for m in h.sent if isinstance(m, ResponseCreated)]
    assert [status for status, _ in done] == ["completed", "completed"]
    assert [rid for _, rid in done] == created
    assert any(isinstance(m, ToolCalls) for m in h.sent)
    assert not any(isinstance(m, Error) for m in h.sent)
    assert EFFECTS >= 15


@pytest.mark.parametrize("at", range(1, EFFECTS + 1))
def test_a_failure_at_any_effect_ends_its_response_once_and_the_session_goes_on(
    at: int, monkeypatch: pytest.MonkeyPatch
):
    h = RecoveringHarness()
    h.start()
    lost: list[Any] = []
    send, do = failing(at, lost)
    monkeypatch.setattr(Outbox, "send", send)
    monkeypatch.setattr(Outbox, "do", do)
    conversation(h)
    monkeypatch.undo()
    assert lost, "the injected failure never happened"

    created = [m.response_id for m in h.sent if isinstance(m, ResponseCreated)]
    done = Counter(m.response_id for m in h.sent if isinstance(m, ResponseDone))
    assert created, "the conversation started no response"
    assert {rid: done[rid] for rid in created} == dict.fromkeys(created, 1)
    # The one response.done without its response.created: the created was the failure.
    unannounced = [e.response_id for e in lost if isinstance(e, ResponseCreated)]
    assert set(done) <= set(created) | set(unannounced)
    assert all(done[rid] == 1 for rid in unannounced)
    internal = [m for m in h.sent if isinstance(m, Error) and m.code == "internal"]
    assert len(internal) <= 1  # once (none when the failing effect was the report itself)
    replies = {
        m.response_id: m.in_reply_to for m in [*h.sent, *lost] if isinstance(m, ResponseCreated)
    }
    for error in internal:
        assert error.response_id in replies
        assert error.in_reply_to == replies[error.response_id]
    seqs = [m.seq for m in h.sent]
    assert seqs == sorted(set(seqs))

    # The session goes on: a message now gets a whole response.
    sent = h.feed(UserMessage(text="after", id="m3"))
    while not any(isinstance(m, ResponseCreated) and m.in_reply_to == "m3" for m in sent):
        # Whatever is still running or queued finishes first.
        more = h.model(ModelText("."), ModelFinish())
        assert more, "the session is stuck"
        sent += more
    (new,) = [m for m in sent if isinstance(m, ResponseCreated) and m.in_reply_to == "m3"]
    sent += h.model(ModelText("fine"), ModelFinish())
    assert [
        m.status for m in sent if isinstance(m, ResponseDone) and m.response_id == new.response_id
    ] == ["completed"]


def test_a_failure_when_no_response_runs_answers_the_message(monkeypatch: pytest.MonkeyPatch):
    h = RecoveringHarness()
    h.start()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise Injected("in the core")

    monkeypatch.setattr(h.session, "_start_response", broken)
    (error,) = h.feed(UserMessage(text="hi", id="m1"))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to) == ("internal", "m1")
    monkeypatch.undo()
    sent = h.feed(UserMessage(text="again", id="m2"))
    assert isinstance(sent[0], ResponseCreated)
    assert all(not isinstance(e, Send) for e in h.other)


async def test_through_the_gateway_a_failure_starting_the_queued_response_ends_it(
    monkeypatch: pytest.MonkeyPatch,
):
    # The case read in the driver: the core raises while applying a model event after
    # the next queued response has started (inside its _start_step). The failure is
    # reported for that response, which ends; the session answers the next message.
    from gateway.core.responses import Responses

    real = Responses._start_step
    starts = 0

    def start_step(self: Responses, response: Any, *, again: bool = False) -> None:
        nonlocal starts
        starts += 1
        if starts == 2:  # the queued message's response, started by the first one's end
            raise Injected("in _start_step")
        real(self, response, again=again)

    monkeypatch.setattr(Responses, "_start_step", start_step)
    async with serving() as gateway, session(gateway.url) as (conn, _):
        await conn.send(UserMessage(text="first", id="m1"))
        await conn.send(UserMessage(text="second", id="m2"))
        sent = await conn.recv_until(
            lambda e: isinstance(e, ResponseDone) and e.status != "completed"
        )
        created = {e.in_reply_to: e.response_id for e in sent if isinstance(e, ResponseCreated)}
        done = {e.response_id: e.status for e in sent if isinstance(e, ResponseDone)}
        assert done == {created["m1"]: "completed", created["m2"]: "failed"}
        (error,) = [e for e in sent if isinstance(e, Error)]
        assert (error.code, error.in_reply_to, error.response_id) == (
            "internal",
            "m2",
            created["m2"],
        )
        await conn.send(UserMessage(text="third", id="m3"))
        sent = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        (third,) = [e for e in sent if isinstance(e, ResponseCreated)]
        assert third.in_reply_to == "m3"
        assert [e.status for e in sent if isinstance(e, ResponseDone)] == ["completed"]
