"""A running server tool's own news, in the pure core: a sync call that turns async when its
tool says it will take long (``ToolDeferred``), and the handle a call keeps to its work
(``ToolHandle``), which a node taking the session over re-attaches to (``ResumeTool``). And a
Python tool that defers, over a real socket (the A2A ones: tests/test_a2a_tools.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from gateway.core.event import (
    ResumeTool,
    RunTool,
    ToolDeferred,
    ToolFinished,
    ToolHandle,
)
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.session import Session
from gateway.core.state import decode_state, encode_state
from gateway.core.transcript import ToolOutcome
from gateway.wire.v1 import ResponseCreated, ResponseDone, ToolStatus, UserMessage
from tests.data.tools import gate, reset_gates
from tests.support import say, serving, session, streamed_text
from tests.test_session import LIMITS, Harness, persisted, start_async

__all__ = ["persisted"]  # the fixture runs each test live and persisted


def start_weather(h: Harness) -> str:
    """A sync server tool running in a response that waits for it; its call id."""
    h.start()
    h.feed(UserMessage(text="weather"))
    (running,) = h.model(ModelToolCall(name="weather", args={}), ModelFinish())
    assert isinstance(running, ToolStatus)
    assert running.status == "running"
    return running.call_id


def test_a_deferred_sync_call_turns_pending_and_the_turn_goes_on() -> None:
    h = Harness()
    call_id = start_weather(h)
    (pending,) = h.feed(ToolDeferred(call_id=call_id))
    assert isinstance(pending, ToolStatus)
    assert (pending.call_id, pending.status) == (call_id, "pending")
    assert h.saved[-1].execution == "async"
    # The model's next step has the pending answer, as for an async tool.
    assert h.last_model_call().request.items[-1] == ToolOutcome(
        call_id=call_id, name="weather", output={"status": "pending"}
    )
    done = h.model(ModelText("checking"), ModelFinish())[-1]
    assert isinstance(done, ResponseDone)
    assert done.status == "completed"
    # Its result later is a completion, in a response of its own (the tool's delivery).
    completed, created = h.feed(ToolFinished(call_id=call_id, output={"sunny": True}))
    assert isinstance(completed, ToolStatus)
    assert (completed.status, completed.result) == ("completed", {"sunny": True})
    assert isinstance(created, ResponseCreated)
    assert created.call_id == call_id


def test_a_deferral_changes_nothing_once_the_call_is_async_or_settled() -> None:
    h = Harness()
    h.start()
    call_id = start_async(h)
    assert h.feed(ToolDeferred(call_id=call_id)) == []  # async already
    h.feed(ToolFinished(call_id=call_id, output={"at": "depot"}))
    assert h.feed(ToolDeferred(call_id=call_id)) == []  # settled
    assert h.feed(ToolDeferred(call_id="call_unknown")) == []


def test_a_kept_handle_is_saved_and_followed_by_the_node_that_adopts_the_session() -> None:
    h = Harness()
    call_id = start_weather(h)
    assert h.feed(ToolHandle(call_id=call_id, handle={"task_id": "t1"})) == []
    assert h.saved[-1].handle == {"task_id": "t1"}

    # Another node restores the session and adopts it: it re-attaches to the kept work
    # (the call is not run again, nor marked lost).
    state = decode_state(encode_state(h.session.state()))
    adopted = Session.restore(h.settings, state, new_id=h.new_id)
    adopted.adopt(h.now)
    effects = adopted.effects()
    assert (
        ResumeTool(
            call_id=call_id,
            tool="weather",
            handle={"task_id": "t1"},
            response_id=h.saved[-1].response_id,
            agent="test",
        )
        in effects
    )
    assert not [e for e in effects if isinstance(e, RunTool)]
    call = adopted.call(call_id)
    assert call is not None
    assert not call.elsewhere

    # A call without a handle is still left to the node that ran it.
    h2 = Harness()
    other = start_weather(h2)
    h2.session.adopt(h2.now)
    assert not [e for e in h2.session.effects() if isinstance(e, ResumeTool)]
    call = h2.session.call(other)
    assert call is not None
    assert call.elsewhere


def test_a_settled_call_forgets_its_handle() -> None:
    h = Harness()
    call_id = start_weather(h)
    h.feed(ToolHandle(call_id=call_id, handle={"task_id": "t1"}))
    h.feed(ToolFinished(call_id=call_id, output={"sunny": True}))
    call = h.session.call(call_id)
    assert call is not None
    assert call.handle is None  # slimmed once the model had its outcome
    assert h.feed(ToolHandle(call_id=call_id, handle={"task_id": "t2"})) == []


def test_a_handle_too_big_to_keep_is_not_kept() -> None:
    h = Harness(limits=msgspec.structs.replace(LIMITS, max_tool_result_size=1_000))
    call_id = start_weather(h)
    saved = len(h.saved)
    h.feed(ToolHandle(call_id=call_id, handle={"blob": "x" * 1_000}))
    assert len(h.saved) == saved
    call = h.session.call(call_id)
    assert call is not None
    assert call.handle is None


PYTHON_TOOL = '''
from gateway import Progress, tool
from tests.data.tools import gate


@tool(timeout=30)
async def slow_lookup(query: str, progress: Progress) -> str:
    """Looks something up; slowly, when it says so."""
    if query.startswith("slow"):
        progress.defer()
    await gate("slow_lookup").wait()
    return f"found {query}"
'''

DEFER_SCENARIO = """
pace = 0

[[rules]]
match = '^look up (?P<q>.*)$'
calls = [{ tool = "slow_lookup", args = { query = "{q}" } }]

[[results]]
tool = "slow_lookup"
when = "pending"
say = "On it."

[[results]]
tool = "slow_lookup"
say = "Got {output}."

[[completions]]
tool = "slow_lookup"
say = "Later: {output}."
"""


async def test_a_python_tool_that_defers_turns_pending_over_a_real_socket(tmp_path: Path) -> None:
    reset_gates()
    (tmp_path / "deferring_tools.py").write_text(PYTHON_TOOL)
    (tmp_path / "scenario.toml").write_text(DEFER_SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'name = "deferring"\n[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
        '[[server_tools]]\nref = "deferring_tools.py:slow_lookup"\n'
    )
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, _):
        events = await say(conn, "look up slow thing")
        assert [s.status for s in events if isinstance(s, ToolStatus)] == ["running", "pending"]
        assert streamed_text(events) == "On it."
        gate("slow_lookup").set()
        later = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
        assert streamed_text(later) == "Later: found slow thing."
        # A call that does not defer stays sync: the turn waits for it.
        events = await say(conn, "look up quick")
        assert [s.status for s in events if isinstance(s, ToolStatus)] == [
            "running",
            "completed",
        ]
        assert streamed_text(events) == "Got found quick."
