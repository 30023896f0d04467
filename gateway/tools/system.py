"""Built-in tools an agent enables by name (``system_tools`` in an agent file), as a
``ToolBackend``:

- ``get_current_time`` tells the time in the client's time zone, when the client sent one
  in ``session.start`` (``time_zone``), else in UTC;
- ``end_session`` ends the session once the agent's answer is done (the session core
  does it when the call completes: ``ToolDef.ends_session``);
- ``transfer_to_agent`` hands the conversation to one of the agents the file lists in
  ``[[transfers]]`` (the session core switches when the call completes:
  ``ToolDef.transfers``).
"""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.core.tool import ToolDef
from gateway.errors import ConfigError
from gateway.tools.base import NOBODY, BackendKind, Caller, ReportProgress

__all__ = ["SYSTEM_TOOLS", "SystemToolName", "SystemTools", "TransferTarget", "transfer_tool"]

SystemToolName = Literal["get_current_time", "end_session", "transfer_to_agent"]

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


@dataclass(frozen=True)
class TransferTarget:
    """An agent the conversation may be handed to, as the model is told of it."""

    name: str
    description: str


def transfer_tool(targets: Sequence[TransferTarget]) -> ToolDef:
    """``transfer_to_agent``, offering ``targets`` (by name, with what each is for)."""
    listed = "\n".join(f"- {t.name}: {t.description}" for t in targets)
    return ToolDef(
        name="transfer_to_agent",
        description=(
            "Hand the conversation over to another agent when the user needs what it does"
            " and you do not. It answers from then on, with the conversation so far. The"
            f" agents:\n{listed}"
        ),
        kind="server",
        input_schema={
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": [t.name for t in targets]},
                "reason": {"type": "string", "description": "Why, in a few words."},
            },
            "required": ["agent"],
            "additionalProperties": False,
        },
        output_schema={
            "type": "object",
            "properties": {"agent": {"type": "string"}},
            "required": ["agent"],
        },
        display_name="Transfer",
        transfers=True,
    )


class SystemTools:
    """The system tools an agent enables, as one backend (``system``).

    Raises:
        ConfigError: ``transfer_to_agent`` is asked for with no ``targets``, or ``targets``
            are given without it.
    """

    name = "system"
    kind: BackendKind = "system"
    prefix = "system"
    optional = False

    def __init__(
        self,
        names: Sequence[SystemToolName],
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        transfers: Sequence[TransferTarget] = (),
    ) -> None:
        if ("transfer_to_agent" in names) != bool(transfers):
            raise ConfigError(
                "transfer_to_agent in system_tools and [[transfers]] go together: the tool"
                " offers the agents [[transfers]] lists"
            )
        self._definitions = [
            transfer_tool(transfers) if name == "transfer_to_agent" else SYSTEM_TOOLS[name]
            for name in dict.fromkeys(names)
        ]
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
        if name == "transfer_to_agent":
            return {"agent": args["agent"]}  # the session core switches when it completes
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
