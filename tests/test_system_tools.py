"""Built-in tools an agent enables by name: get_current_time tells the time in the user's
time zone (sent in session.start), else UTC; end_session closes the session politely after
the agent's last answer."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import textwrap
from pathlib import Path

import pytest

from client_sdk import SessionClosed, connect
from gateway.agent.file import load_agent
from gateway.core.event import RunTool, ToolFinished
from gateway.core.model import ModelFinish, ModelText, ModelToolCall
from gateway.core.session import Session
from gateway.errors import ConfigError
from gateway.tools.system import SYSTEM_TOOLS, current_time
from gateway.wire.v1 import (
    ResponseDone,
    SessionEnded,
    SessionResumed,
    TextDelta,
    TextDone,
    ToolStatus,
    UserMessage,
)
from tests.support import serving, session
from tests.test_session import Harness, persisted  # noqa: F401

NOON_UTC = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


def test_the_time_is_told_in_the_users_time_zone_or_utc():
    assert current_time(NOON_UTC, "Asia/Tokyo") == {
        "iso": "2026-12-02T21:00:00+09:00",
        "time": "21:00",
        "date": "2026-12-02",
        "weekday": "Wednesday",
        "time_zone": "Asia/Tokyo",
    }
    assert current_time(NOON_UTC, None)["time_zone"] == "UTC"
    unknown = current_time(NOON_UTC, "Mars/Olympus")
    assert (unknown["time"], unknown["time_zone"]) == (
        "12:00",
        "UTC ('Mars/Olympus' is not a time zone this gateway knows)",
    )


def write_agent(tmp_path: Path, system_tools: str) -> Path:
    (tmp_path / "scenario.toml").write_text(
        textwrap.dedent(
            """
            pace = 0
            fallback = "?"
            [[rules]]
            match = "what time"
            calls = [{ tool = "get_current_time" }]
            [[results]]
            tool = "get_current_time"
            say = "It is {output.time} ({output.time_zone})."
            """
        )
    )
    agent = tmp_path / "agent.toml"
    agent.write_text(
        f'name = "clock"\nsystem_tools = {system_tools}\n'
        '[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
    )
    return agent


async def test_a_session_asks_the_time_in_the_time_zone_its_client_sent(tmp_path: Path):
    agent = write_agent(tmp_path, '["get_current_time"]')
    async with (
        serving(agent=str(agent)) as gateway,
        session(gateway.url, time_zone="Asia/Tokyo") as (conn, created),
    ):
        assert [t.name for t in created.tools] == ["get_current_time"]
        await conn.send(UserMessage(text="what time is it?"))
        events = await conn.recv_until(lambda e: isinstance(e, ResponseDone))
    (completed,) = [e for e in events if isinstance(e, ToolStatus) and e.status == "completed"]
    assert completed.result["time_zone"] == "Asia/Tokyo"
    text = "".join(e.delta for e in events if isinstance(e, TextDelta))
    assert text == f"It is {completed.result['time']} (Asia/Tokyo)."


def test_an_unknown_system_tool_is_a_startup_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="system_tools"):
        load_agent(write_agent(tmp_path, '["teleport"]'))


BYE_SCENARIO = """
pace = 0
fallback = "?"
[[rules]]
match = "bye"
say = "Goodbye!"
calls = [{ tool = "end_session", args = { reason = "the user said goodbye" } }]
[[results]]
tool = "end_session"
say = "Take care."
"""


def polite_agent(tmp_path: Path) -> Path:
    """An agent that says goodbye and ends the session when told "bye"."""
    (tmp_path / "scenario.toml").write_text(BYE_SCENARIO)
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'name = "polite"\nsystem_tools = ["end_session"]\n'
        '[model]\nprovider = "scripted"\nscenario = "scenario.toml"\n'
    )
    return agent


async def test_end_session_closes_politely_after_the_last_answer(tmp_path: Path):
    agent = polite_agent(tmp_path)
    async with serving(agent=str(agent)) as gateway, session(gateway.url) as (conn, created):
        await conn.send(UserMessage(text="bye now"))
        events = await conn.recv_until(lambda e: isinstance(e, SessionEnded))
        async with asyncio.timeout(5):
            await conn.websocket.wait_closed()
        code, reason = conn.websocket.close_code, conn.websocket.close_reason
        async with asyncio.timeout(5):
            await gateway.runtime.idle.wait()  # the session is over, not waiting for a resume
    assert [e.text for e in events if isinstance(e, TextDone)] == ["Goodbye!", "Take care."]
    done = [e for e in events if isinstance(e, ResponseDone)]
    assert [d.status for d in done] == ["completed"]
    ended = events[-1]
    assert isinstance(ended, SessionEnded)
    assert ended.reason == "the user said goodbye"
    assert (code, reason) == (1000, "session ended")
    assert created.session_id not in gateway.runtime.drivers


async def test_the_python_sdk_sees_the_session_end_after_the_goodbye(tmp_path: Path):
    agent = polite_agent(tmp_path)
    async with serving(agent=str(agent)) as gateway, connect(gateway.url) as conv:
        events = conv.events()
        assert "".join([d async for d in conv.say("bye now")]) == "Goodbye! Take care."
        seen: list[object] = []

        async def drain() -> None:
            async for event in events:
                seen.append(event)

        with pytest.raises(SessionClosed) as closed:
            await drain()
        assert any(isinstance(e, SessionEnded) for e in seen)
        assert not [e for e in seen if isinstance(e, SessionResumed)]  # over: not resumed
        assert (closed.value.closed_with, closed.value.reason) == (1000, "session ended")
        assert conv.reconnects == 0


def test_the_session_core_ends_after_the_response_that_called_end_session():
    h = Harness()
    h.settings = dataclasses.replace(
        h.settings, tools=h.settings.tools.extended([SYSTEM_TOOLS["end_session"]])
    )
    h.session = Session(h.settings, session_id="sess_1", resume_token="t", new_id=h.new_id)
    h.start()
    h.feed(UserMessage(text="bye"))
    h.feed(UserMessage(text="queued: dropped with the session"))
    h.model(ModelToolCall(name="end_session", args={}), ModelFinish())
    (run,) = [e for e in h.other if isinstance(e, RunTool)]
    h.feed(ToolFinished(call_id=run.call_id, output={"ending": True}))
    assert not h.session.closed  # the model still says goodbye
    sent = h.model(ModelText("Bye!"), ModelFinish())
    assert [type(m).__name__ for m in sent][-2:] == ["ResponseDone", "SessionEnded"]
    assert sent[-1].reason == "goodbye"  # type: ignore[attr-defined]
    assert h.session.closed
    assert h.session.ended_by_agent
