"""Built-in tools an agent enables by name: get_current_time tells the time in the user's
time zone (sent in session.start), else UTC."""

from __future__ import annotations

import datetime
import textwrap
from pathlib import Path

import pytest

from gateway.agent import load_agent
from gateway.errors import ConfigError
from gateway.protocol import ResponseDone, TextDelta, ToolStatus, UserMessage
from gateway.system_tools import current_time
from tests.support import serving, session

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
