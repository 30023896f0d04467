"""Built-in tools an agent enables by name (``system_tools`` in an agent file), as a
``ToolBackend``: ``get_current_time`` tells the time in the client's time zone, when the
client sent one in ``session.start`` (``time_zone``), else in UTC."""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Callable, Sequence
from typing import Any, Literal

from gateway.tool_backend import NOBODY, BackendKind, Caller, ReportProgress
from gateway.tools import ToolDef

__all__ = ["SYSTEM_TOOLS", "SystemToolName", "SystemTools"]

SystemToolName = Literal["get_current_time", "end_session"]

SYSTEM_TOOLS: dict[str, ToolDef] = {
    "get_current_time": ToolDef(
        name="get_current_time",
        description=(
            "The current date and time where the user is (their time zone when their app"
            " sent it, else UTC)."
        ),
        kind="server",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        output_schema={
            "type": "object",
            "properties": {
                "iso": {"type": "string"},
                "time": {"type": "string"},
                "date": {"type": "string"},
                "weekday": {"type": "string"},
                "time_zone": {"type": "string"},
            },
            "required": ["iso", "time", "date", "weekday", "time_zone"],
        },
        display_name="Current time",
        read_only=True,
    ),
    "end_session": ToolDef(
        name="end_session",
        description=(
            "End the conversation politely, when the user says goodbye or it is over: say"
            " your goodbye in the same answer. The session closes once that answer is done."
        ),
        kind="server",
        input_schema={
            "type": "object",
            "properties": {"reason": {"type": "string", "description": "Why, in a few words."}},
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {"ending": {"type": "boolean"}},
            "required": ["ending"],
        },
        display_name="End the conversation",
        ends_session=True,
    ),
}


class SystemTools:
    """The system tools an agent enables, as one backend (``system``)."""

    name = "system"
    kind: BackendKind = "system"
    prefix = "system"
    optional = False

    def __init__(
        self,
        names: Sequence[SystemToolName],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._definitions = [SYSTEM_TOOLS[name] for name in dict.fromkeys(names)]
        self._clock = clock

    async def start(self) -> None:
        """Nothing to start: they are built in."""

    def definitions(self) -> list[ToolDef]:
        return list(self._definitions)

    def on_change(self, listener: Callable[[], None]) -> None:
        """They never change."""

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        progress: ReportProgress,
        caller: Caller = NOBODY,
    ) -> Any:
        if name == "end_session":
            return {"ending": True}  # the session core ends the session after the response
        return current_time(self._clock(), caller.time_zone)

    async def aclose(self) -> None:
        """Nothing to close."""


def current_time(now: datetime.datetime, time_zone: str | None) -> dict[str, str]:
    """``now`` in ``time_zone`` (an IANA name; UTC when absent or unknown)."""
    zone: datetime.tzinfo = datetime.UTC
    name = "UTC"
    if time_zone:
        try:
            zone, name = zoneinfo.ZoneInfo(time_zone), time_zone
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            name = f"UTC ({time_zone!r} is not a time zone this gateway knows)"
    local = now.astimezone(zone)
    return {
        "iso": local.isoformat(timespec="seconds"),
        "time": local.strftime("%H:%M"),
        "date": local.date().isoformat(),
        "weekday": local.strftime("%A"),
        "time_zone": name,
    }
