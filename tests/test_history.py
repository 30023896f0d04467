"""The bounded transcript in the pure core: the history budget and the result size cap."""

from __future__ import annotations

import msgspec

from gateway.core.event import CallModel, ToolFinished
from gateway.core.history import History, item_size, items_size
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.transcript import AssistantTurn, ContextNote, RequestedCall, ToolOutcome, UserTurn
from gateway.wire.v1 import (
    Error,
    Limits,
    ResponseDone,
    ToolCalls,
    ToolResult,
    ToolResults,
    ToolStatus,
    UserMessage,
)
from tests.test_session import LIMITS, Harness, lamp_call, persisted  # noqa: F401


def _turn(history: History, text: str, answer: str) -> None:
    history.begin_turn()
    history.append(UserTurn(text=text))
    history.append(AssistantTurn(text=answer))


def _call_turn(history: History, call_id: str, output: object) -> None:
    """A turn with one tool call and its outcome: user, call, outcome, answer."""
    history.begin_turn()
    history.append(UserTurn(text="use the tool"))
    history.append(
        AssistantTurn(calls=(RequestedCall(call_id=call_id, name="lamp", args={"on": True}),))
    )
    history.append(ToolOutcome(call_id=call_id, name="lamp", output=output))
    history.append(AssistantTurn(text="done"))


# ----------------------------------------------------------------- History alone


def test_size_counts_text_and_the_json_of_arguments_and_outputs():
    call = RequestedCall(call_id="c", name="lamp", args={"on": True})
    assert item_size(UserTurn(text="hello")) == 5
    assert item_size(AssistantTurn(text="ab", calls=(call,))) == 2 + len('{"on":true}')
    assert item_size(ToolOutcome(call_id="c", name="lamp", output={"ok": 1})) == len('{"ok":1}')
    assert item_size(ToolOutcome(call_id="c", name="lamp", error="no")) == len("null") + 2
    assert item_size(ContextNote(text="abc")) == 3


def test_oldest_whole_turns_go_first():
    history = History(max_chars=25)
    _turn(history, "a" * 10, "b" * 10)  # 20
    _turn(history, "c" * 5, "d" * 5)  # 10
    _turn(history, "e" * 5, "f" * 5)  # 10: the turn in progress
    assert history.size == 40
    assert history.trim() == 2
    # The first turn went whole (user and answer); the two newer ones fit in 20.
    assert history.items == (
        UserTurn(text="c" * 5),
        AssistantTurn(text="d" * 5),
        UserTurn(text="e" * 5),
        AssistantTurn(text="f" * 5),
    )
    assert (history.size, history.turns) == (20, 2)
    assert history.trim() == 0  # within the budget now: nothing more goes


def test_within_budget_or_without_one_nothing_goes():
    for budget in (None, 1_000):
        history = History(max_chars=budget)
        for n in range(5):
            _turn(history, f"question {n}", f"answer {n}")
        assert history.trim() == 0
        assert history.turns == 5


def test_the_turn_in_progress_stays_even_alone_over_the_budget():
    history = History(max_chars=10)
    _turn(history, "old", "turn")
    _turn(history, "x" * 50, "y" * 50)  # the turn in progress, 100 on its own
    assert history.trim() == 2
    assert history.items == (UserTurn(text="x" * 50), AssistantTurn(text="y" * 50))
    assert history.trim() == 0  # never cut inside it


def test_a_tool_call_and_its_outcome_stay_together():
    history = History(max_chars=60)
    _call_turn(history, "call_1", {"big": "z" * 100})
    _turn(history, "q", "a")
    history.trim()
    kept = history.items
    # The call's turn went whole: no outcome without its call, no call without its outcome.
    assert kept == (UserTurn(text="q"), AssistantTurn(text="a"))


def test_a_turn_start_between_a_call_and_its_outcome_is_never_a_cut():
    # A call answered in a later turn (the session never does that, the trimming still
    # must not orphan the outcome): the cut skips to the first turn start past it.
    history = History(max_chars=30)
    history.begin_turn()
    history.append(UserTurn(text="u" * 20))
    history.append(AssistantTurn(calls=(RequestedCall(call_id="c", name="lamp", args={}),)))
    _turn(history, "v" * 20, "w")
    history.append(ToolOutcome(call_id="c", name="lamp", output="late"))
    _turn(history, "x" * 5, "y")
    history.trim()
    assert history.items == (UserTurn(text="x" * 5), AssistantTurn(text="y"))


def test_context_notes_count_and_go_with_their_turn():
    history = History(max_chars=38)  # 39 with the note, 9 without
    history.begin_turn()
    history.append(ContextNote(text="n" * 30, call_id="c"))  # context before the user spoke
    history.append(UserTurn(text="hi"))
    history.append(AssistantTurn(text="hello"))
    assert history.size == 37
    _turn(history, "q", "a")
    assert history.trim() == 3  # the note pushed the total over; it went with its turn
    assert history.items == (UserTurn(text="q"), AssistantTurn(text="a"))


# ----------------------------------------------------------------- in the session


def _capped(max_tool_result_size: int) -> Limits:
    return msgspec.structs.replace(LIMITS, max_tool_result_size=max_tool_result_size)


def _answer(h: Harness, text: str, reply: str) -> None:
    h.feed(UserMessage(text=text))
    done = h.model(ModelText(reply), ModelFinish())[-1]
    assert isinstance(done, ResponseDone)


def test_the_model_never_gets_more_than_the_budget_past_the_turn_in_progress():
    h = Harness(max_history_chars=160)
    h.start()
    for n in range(10):
        _answer(h, f"question {n} " + "q" * 20, f"answer {n} " + "a" * 20)
    requests = [e.request for e in h.other if isinstance(e, CallModel)]
    assert len(requests) == 10
    assert all(items_size(r.items) <= 160 for r in requests)
    last = requests[-1].items
    # Whole turns: it starts with a user's words and ends with the question asked now.
    assert isinstance(last[0], UserTurn)
    assert last[-1] == UserTurn(text="question 9 " + "q" * 20)
    assert len(last) == 5  # two earlier turns of 60 (question and answer), and the question


def test_a_step_after_a_tool_call_keeps_its_whole_turn():
    h = Harness(max_history_chars=60)
    h.start()
    _answer(h, "q" * 30, "a" * 20)
    h.feed(UserMessage(text="lamp on " + "l" * 40))
    (batch,) = h.model(lamp_call(), ModelFinish())
    assert isinstance(batch, ToolCalls)
    call = batch.calls[0]
    h.feed(ToolResults(results=[ToolResult(call_id=call.call_id, tool="lamp", output={"ok": 1})]))
    items = h.last_model_call().request.items
    # Over the budget alone, the turn in progress goes whole: words, call, outcome.
    assert [type(i) for i in items] == [UserTurn, AssistantTurn, ToolOutcome]
    assert items[2] == ToolOutcome(call_id=call.call_id, name="lamp", output={"ok": 1})


def _lamp_call_waiting(h: Harness) -> str:
    """Start the session and a turn whose model asks for the lamp; the call's id."""
    h.start()
    h.feed(UserMessage(text="lamp on"))
    (batch,) = h.model(lamp_call(), ModelFinish())
    assert isinstance(batch, ToolCalls)
    return batch.calls[0].call_id


def test_an_oversized_client_result_fails_the_call_and_is_kept_nowhere():
    h = Harness(limits=_capped(1_000))
    call_id = _lamp_call_waiting(h)
    big = ToolResult(call_id=call_id, tool="lamp", output={"ok": "x" * 5_000})
    error, status = h.feed(ToolResults(id="r1", results=[big]))
    assert isinstance(error, Error)
    assert (error.code, error.in_reply_to, error.call_id) == ("invalid_result", "r1", call_id)
    assert "max_tool_result_size" in error.message
    assert "1000" in error.message
    assert isinstance(status, ToolStatus)
    assert status.status == "failed"
    assert status.error is not None
    assert len(status.error) < 100
    # The model gets a short tool error; no copy of the value is kept anywhere.
    outcome = h.last_model_call().request.items[-1]
    assert outcome == ToolOutcome(call_id=call_id, name="lamp", error=status.error)
    assert h.saved[-1].output is None
    assert h.saved[-1].state == "failed"
    # A resend gets the stored failed status, as for any settled call.
    (again,) = h.feed(ToolResults(results=[big]))
    assert isinstance(again, ToolStatus)
    assert (again.status, again.duplicate) == ("failed", True)


def test_an_oversized_client_error_is_refused_too():
    h = Harness(limits=_capped(1_000))
    call_id = _lamp_call_waiting(h)
    sent = h.feed(
        ToolResults(results=[ToolResult(call_id=call_id, tool="lamp", error="e" * 2_000)])
    )
    assert isinstance(sent[0], Error)
    assert sent[0].code == "invalid_result"
    assert isinstance(sent[1], ToolStatus)
    assert "too large" in (sent[1].error or "")


def test_an_oversized_server_tool_output_fails_its_call():
    h = Harness(limits=_capped(1_000))
    h.start()
    h.feed(UserMessage(text="weather"))
    (running,) = h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    assert isinstance(running, ToolStatus)
    (failed,) = h.feed(ToolFinished(call_id=running.call_id, output={"report": "r" * 5_000}))
    assert isinstance(failed, ToolStatus)
    assert failed.status == "failed"
    assert failed.result is msgspec.UNSET
    assert failed.error == "output too large: 5013 bytes of JSON, the limit is 1000"
    outcome = h.last_model_call().request.items[-1]
    assert isinstance(outcome, ToolOutcome)
    assert (outcome.output, outcome.error) == (None, failed.error)


def test_a_result_at_the_cap_is_accepted():
    h = Harness(limits=_capped(len('{"ok":"xxxx"}')))
    result = ToolResult(call_id=_lamp_call_waiting(h), tool="lamp", output={"ok": "xxxx"})
    (status,) = h.feed(ToolResults(results=[result]))
    assert isinstance(status, ToolStatus)
    assert status.status == "completed"


def test_since_a_mark_says_what_was_dropped_and_what_was_added():
    history = History(max_chars=10)
    history.begin_turn()
    history.extend([UserTurn(text="aaaa"), AssistantTurn(text="bbbb")])
    mark = history.mark
    assert mark == (0, 2, 0)  # first, end, rewrites
    history.begin_turn()
    history.append(UserTurn(text="cccc"))
    history.trim()  # the first turn goes
    assert history.since(mark) == (2, [UserTurn(text="cccc")])
    mark = history.mark
    history.begin_turn()
    history.append(UserTurn(text="dddd"))
    history.begin_turn()
    history.append(UserTurn(text="eeeeeeeee"))
    history.trim()  # drops what was kept at the mark and what came after it, but the last
    assert history.since(mark) == (1, [UserTurn(text="eeeeeeeee")])


def test_since_a_mark_before_a_truncation_rewrites_everything_kept():
    history = History()
    history.begin_turn()
    history.extend([UserTurn(text="hi"), AssistantTurn(text="hello there")])
    mark = history.mark
    assert history.truncate_last_turn(5)
    assert history.items == (UserTurn(text="hi"), AssistantTurn(text="hello"))
    assert history.size == len("hi") + len("hello")
    assert history.since(mark) == (2, [UserTurn(text="hi"), AssistantTurn(text="hello")])
    assert not history.truncate_last_turn(99)  # nothing to cut: no rewrite
    assert history.since(history.mark) == (0, [])
