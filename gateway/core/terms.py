"""What a session runs under: its agent, the tools it offers, its instructions and defaults.

Part of the pure session core: no I/O. The client sets these in ``session.start`` and
changes them in ``session.update`` (its own functions, what it adds to the agent's
instructions, the default ``tool_choice``, ``max_steps``, tool mode and voice segments);
the agent switches to another one when its ``transfer_to_agent`` call returns, and ends
the session once the response is done when its ``end_session`` call completes. The values
live in the session's state (``SessionState``); ``Terms`` holds the ``Toolset`` they come
from (the settings of the agent the session is with) and the rules that say whether a
request can be honoured: when it cannot, the client gets an ``error`` saying why and
nothing changes.
"""

from __future__ import annotations

from typing import Any

from gateway.core.call import CallState
from gateway.core.dispatch import Dispatcher
from gateway.core.event import ToolFinished
from gateway.core.inbound import SessionStart, SessionUpdate, ToolSpec
from gateway.core.outbound import AgentTransferred
from gateway.core.outbox import Outbox
from gateway.core.settings import SessionSettings
from gateway.core.state import SessionState
from gateway.core.tool import ToolRegistry
from gateway.core.toolset import Refusal, Toolset, tool_infos
from gateway.errors import ConfigError

__all__ = ["Terms"]


class Terms:
    """The terms of one session; see the module docstring.

    Args:
        state: the session's state, whose terms this object sets.
        toolset: the agent's tools and the client's own functions (``state``'s).
        calls: the dispatcher, which runs calls with the tools these terms offer.
        outbox: where refusals go, as ``error`` events.
    """

    __slots__ = (
        "_calls",
        "_out",
        "_state",
        "_toolset",
    )  # one of each per session: no __dict__ each

    def __init__(
        self, state: SessionState, toolset: Toolset, *, calls: Dispatcher, outbox: Outbox
    ) -> None:
        self._state = state
        self._toolset = toolset
        self._calls = calls
        self._out = outbox

    @property
    def settings(self) -> SessionSettings:
        """The settings of the agent the session is with (another after a transfer)."""
        return self._toolset.settings

    def start(self, msg: SessionStart) -> bool:
        """Take the terms ``session.start`` asks for; ``False`` after an ``error`` (then
        nothing changed)."""
        if msg.agent is not None and msg.agent != self.settings.agent:
            self._out.error(
                "invalid_message", f"unknown agent {msg.agent[:64]!r}", in_reply_to=msg.id
            )
            return False
        tools = self._tools_with(msg.client_functions, msg.id)
        if tools is None or not self.choice_fits(
            tools, msg.tool_choice, msg.max_steps, None, msg.id
        ):
            return False
        state = self._state
        self._offer(tools, msg.client_functions)
        state.tool_choice = msg.tool_choice or "auto"
        state.max_steps = msg.max_steps
        state.tool_mode = msg.tool_mode or "auto"
        state.segments = bool(msg.segments)
        if msg.instructions:
            self._add_instructions(msg.instructions)
        return True

    def update(self, msg: SessionUpdate) -> bool:
        """Replace the client's own functions, extra instructions, default ``tool_choice``
        or ``max_steps`` mid-session (all of them, or none after an ``error``: then
        ``False``)."""
        state = self._state
        tools, specs = self._calls.tools, self._toolset.client_specs
        if msg.client_functions is not None:
            changed = self._tools_with(msg.client_functions, msg.id)
            if changed is None:
                return False
            tools, specs = changed, msg.client_functions
        choice = msg.tool_choice or state.tool_choice
        if not self.choice_fits(tools, choice, msg.max_steps, None, msg.id):
            return False
        self._offer(tools, specs)
        state.tool_choice = choice
        if msg.max_steps is not None:
            state.max_steps = msg.max_steps
        if msg.tool_mode is not None:
            state.tool_mode = msg.tool_mode
        if msg.segments is not None:
            state.segments = msg.segments
        if msg.instructions is not None:
            self._add_instructions(msg.instructions)
        return True

    def choice_fits(
        self,
        tools: ToolRegistry,
        choice: str | None,
        max_steps: int | None,
        narrowed: list[str] | None,
        msg_id: str | None,
    ) -> bool:
        """Whether a ``tool_choice``, ``max_steps`` and ``tools`` narrowing asked for can
        be honoured with ``tools``; if not, the client gets an ``error`` saying why."""
        problem = self._toolset.choice_problem(tools, choice, max_steps, narrowed)
        if problem is not None:
            self._out.error("invalid_message", problem, in_reply_to=msg_id)
        return problem is None

    def declared_schemas(self, msg: SessionStart | SessionUpdate) -> list[dict[str, Any]]:
        """The schemas ``msg`` declares that the session will check, in the order it checks
        them."""
        return self._toolset.declared_schemas(msg.client_functions or [])

    def hand_over_if_asked(
        self, event: ToolFinished
    ) -> tuple[ToolFinished, AgentTransferred | None]:
        """A ``transfer_to_agent`` call that returned: the session switches to the agent it
        names now, so the response's next step is that agent's. The event to settle the
        call with (failed, saying why, if the switch cannot be), and the one to send."""
        calls = self._calls
        call = calls.ledger.get(event.call_id)
        if call is None or call.settled or event.error is not None:
            return event, None
        entry = calls.tools.get(call.tool)
        if entry is None or not entry.definition.transfers:
            return event, None
        name = call.args.get("agent")
        profile = self.settings.agents(name) if isinstance(name, str) else None
        if profile is None or profile.agent == self.settings.agent:
            return ToolFinished(call_id=call.call_id, error=f"no agent {name!r} to go to"), None
        try:
            toolset, tools = self._toolset.handed_to(profile)
        except ConfigError as exc:  # a client function clashes with one of its tools
            return ToolFinished(call_id=call.call_id, error=f"cannot transfer: {exc}"), None
        if len(tools) and not profile.model_supports_tools:
            error = f"cannot transfer: the model of {name!r} cannot call tools"
            return ToolFinished(call_id=call.call_id, error=error), None
        previous, self._toolset = self.settings.agent, toolset
        calls.tools, calls.confirm_rules = tools, profile.confirm_rules
        calls.agent = self._state.agent = profile.agent
        self._state.instructions = _joined(profile.instructions, self._state.client_instructions)
        reason = call.args.get("reason")
        return event, AgentTransferred(
            agent=profile.agent,
            previous_agent=previous,
            tools=tool_infos(tools),
            reason=reason if isinstance(reason, str) and reason else None,
            response_id=call.response_id,
        )

    def note_ending(self, call_id: str) -> None:
        """A completed ``end_session`` call: the session ends after this response."""
        call = self._calls.ledger.get(call_id)
        state = self._state
        if call is None or call.state is not CallState.COMPLETED or state.ending is not None:
            return
        entry = self._calls.tools.get(call.tool)
        if entry is not None and entry.definition.ends_session:
            reason = call.args.get("reason")
            state.ending = reason if isinstance(reason, str) and reason else "goodbye"

    def _offer(self, tools: ToolRegistry, specs: list[ToolSpec]) -> None:
        """Offer ``tools``, with the client's own functions ``specs`` among them."""
        self._calls.tools = tools
        self._toolset.client_specs = self._state.client_functions = specs

    def _add_instructions(self, added: str) -> None:
        """What the client adds to the agent's instructions (kept across transfers)."""
        self._state.client_instructions = added
        self._state.instructions = _joined(self.settings.instructions, added)

    def _tools_with(self, specs: list[ToolSpec], msg_id: str | None) -> ToolRegistry | None:
        """The agent's tools plus the client's functions among ``specs``; ``None`` after an
        error (``Toolset.accepted`` says why)."""
        tools = self._toolset.accepted(specs)
        if isinstance(tools, Refusal):
            self._out.error(tools.code, tools.message, in_reply_to=msg_id)
            return None
        return tools


def _joined(instructions: str, added: str | None) -> str:
    """An agent's instructions with what the client added to them."""
    return f"{instructions}\n\n{added}".strip() if added else instructions
