"""Tool calls through their one lifecycle: dispatch, results, progress, expiry.

Part of the pure session core. The Dispatcher turns the model's tool requests
into ``Call`` records, sends client functions to the client in one batch, asks
the driver to run server tools, and settles each call exactly once, whoever
answers and whenever. An async call that settles becomes a ``Completion``, which
the session delivers to the model as context. Whether a call may run, and whether
an outcome may settle it, ``call_check`` decides; the Dispatcher acts on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.core.call import Call, CallState, Ledger
from gateway.core.call_check import (
    Refused,
    before_run,
    echo_mismatch,
    output_problem,
    oversize,
    too_large,
)
from gateway.core.confirm import ConfirmRule, prompt_for
from gateway.core.event import (
    CancelTool,
    ResumeTool,
    RunTool,
    SaveCall,
    ToolDeferred,
    ToolFinished,
    ToolHandle,
    ToolProgress,
)
from gateway.core.inbound import ToolConfirmation, ToolResult, ToolRun
from gateway.core.model import ModelToolCall
from gateway.core.outbound import ClientCall, ConfirmItem, ToolCalls, ToolConfirm, ToolStatus
from gateway.core.outbox import Outbox
from gateway.core.settings import SessionSettings
from gateway.core.tool import ToolEntry, ToolRegistry, default_display_name
from gateway.core.transcript import PENDING, ToolOutcome, completion_note
from gateway.core.widget import render

__all__ = ["Completion", "Dispatcher", "client_call"]

_TIMEOUT_ERROR = "tool_timeout: the tool did not finish in time"
_LOST_ERROR = (
    "tool_timeout: the tool was running on another gateway node when this session moved"
    " (that node stopped or let the session go) and its outcome did not arrive in time;"
    " it is not run again"
)


@dataclass(frozen=True, slots=True)
class Completion:
    """An async call that settled; ``note`` is the context the model gets."""

    call: Call
    note: str


class Dispatcher:
    """Runs the lifecycle of every tool call of one session.

    Args:
        outbox: where events about calls and the effects that run them go.
        settings: the session's (its agent's, then another's after a transfer: ``tools``,
            ``confirm_rules`` and ``agent`` change then): whom calls run for, the limits.
        tools: the tools calls run with (the agent's and the client's own functions).
        new_id: makes the ids of calls.
        ledger: the calls of a session restored from its state; ``None``: none yet.
    """

    def __init__(
        self,
        outbox: Outbox,
        settings: SessionSettings,
        *,
        tools: ToolRegistry,
        new_id: Callable[[str], str],
        ledger: Ledger | None = None,
    ) -> None:
        self.tools = tools
        self.confirm_rules: Mapping[str, ConfirmRule] = settings.confirm_rules
        """The rules ``confirm_rule`` names (``gateway.core.confirm``), by reference."""
        self.agent = settings.agent
        """The agent whose server tools run (after a transfer, not the gateway's own)."""
        self._principal = settings.principal
        """Whom the calls run for: the scopes a tool requires are checked against theirs."""
        self.ledger = ledger if ledger is not None else Ledger()
        self._out = outbox
        self._new_id = new_id
        self._client_call_timeout = settings.limits.client_call_timeout
        self._server_tool_timeout = settings.server_tool_timeout
        self._max_result_size = settings.limits.max_tool_result_size
        """Bytes of JSON an output or error may have; a bigger one fails its call unstored."""

    # ----------------------------------------------------------------- dispatch

    def start(
        self,
        requests: Sequence[ModelToolCall],
        *,
        response_id: str,
        now: float,
        refuse: Callable[[str], str | None] = lambda _: None,
        manual: bool = False,
    ) -> list[Call]:
        """Create and start the calls of one model step.

        Client functions go out together in one ``tool.calls``, after the
        status of any server tool and of any call refused before dispatch. ``refuse``
        says why a tool may not be called in this response (``gateway.core.tool_choice``):
        such a call fails at once, and the model sees why. With ``manual`` (manual tool
        mode), server tools go to the client too, and run here only if it asks
        (``run_on_gateway``).
        """
        calls = [self._new_call(request, response_id, now, manual) for request in requests]
        batch: list[ClientCall] = []
        asking: list[ConfirmItem] = []
        for call, request in zip(calls, requests, strict=True):
            if (reason := refuse(call.tool)) is not None:
                self._settle(call, CallState.FAILED, error=reason)
            elif request.args_error is not None:
                self._settle(
                    call, CallState.FAILED, error=f"invalid arguments: {request.args_error}"
                )
            elif isinstance(offered := self._dispatch(call, now), ClientCall):
                batch.append(offered)
            elif offered is not None:
                asking.append(offered)
        for call in calls:
            if not call.settled:  # settled ones were saved when they settled
                self._out.do(SaveCall(call))
        if asking:
            self._out.send(ToolConfirm(response_id=response_id, calls=asking))
        if batch:
            self._out.send(ToolCalls(response_id=response_id, calls=batch))
        return calls

    def _new_call(self, request: ModelToolCall, response_id: str, now: float, manual: bool) -> Call:
        entry = self.tools.get(request.name)
        definition = entry.definition if entry else None
        offered = manual and definition is not None and definition.kind == "server"
        is_client = offered or (definition is not None and definition.kind == "client")
        default_timeout = self._client_call_timeout if is_client else self._server_tool_timeout
        timeout = (definition.timeout if definition else None) or default_timeout
        call = Call(
            call_id=self._new_id("call"),
            tool=request.name,
            display_name=(definition.display_name if definition else "")
            or default_display_name(request.name),
            kind="client" if is_client else "server",
            args=request.args,
            response_id=response_id,
            deadline=now + timeout,
            execution=definition.execution if definition else "sync",
            delivery=definition.delivery if definition else "when_idle",
            manual=offered,
        )
        self.ledger.add(call)
        return call

    def _dispatch(self, call: Call, now: float) -> ClientCall | ConfirmItem | None:
        entry = self.tools.get(call.tool)
        verdict = before_run(entry, call, self._principal, self.confirm_rules)
        if isinstance(verdict, Refused):
            self._settle(call, CallState.FAILED, error=verdict.error, code=verdict.code)
            return None
        call.args = verdict.args
        if verdict.ask:  # the user decides
            call.confirming = True
            call.deadline = now + self._client_call_timeout
            return self._confirm_item(call, now)
        return self._proceed(call, now)

    def _proceed(self, call: Call, now: float) -> ClientCall | None:
        """Hand ``call`` to whoever runs it: the client (returned, for ``tool.calls``) or
        the driver."""
        entry = self.tools.get(call.tool)
        widget = entry.definition.widget if entry and not call.manual else None
        if widget is not None and call.kind == "client":
            shown = render(widget, call.args)
            if isinstance(shown, str):
                self._settle(call, CallState.FAILED, error=f"invalid arguments: {shown}")
                return None
            call.widget = shown
        call.dispatched = True
        if call.kind == "client":
            return client_call(call, now)
        self._run(call)
        return None

    def _confirm_item(self, call: Call, now: float) -> ConfirmItem:
        entry = self.tools.get(call.tool)
        template = entry.definition.confirm_prompt if entry else None
        return ConfirmItem(
            call_id=call.call_id,
            tool=call.tool,
            display_name=call.display_name,
            args=call.args,
            prompt=prompt_for(template, call.display_name, call.args),
            deadline=call.deadline,
            timeout=round(max(0.0, call.deadline - now), 3),
            kind="server" if call.kind == "server" else "client",
        )

    def confirmation(self, msg: ToolConfirmation, now: float) -> None:
        """The user's answer to ``tool.confirm``: run the call (with edited arguments, if
        any) or fail it as declined; a bad answer gets an ``error`` and the call waits."""
        call = self.ledger.get(msg.call_id)
        if call is None or not (call.confirming or call.settled or call.dispatched):
            self._unknown_call("call waiting for confirmation", msg.call_id, msg.id)
            return
        entry = self.tools.get(call.tool)
        # A call cancelled while it waited (its response was) is still marked confirming.
        if call.settled or not call.confirming or entry is None:
            self._out.send(_status(call, duplicate=True))  # decided already: once only
            return
        if not msg.approved:
            call.confirming = False
            error = f"declined by the user: {msg.reason or 'no reason given'}"
            self._settle(call, CallState.FAILED, error=error, code="declined")
            return
        args = self._client_args(call, entry, msg.args, msg.id)
        if args is None:
            return
        call.confirming, call.args = False, args
        default = self._client_call_timeout if call.kind == "client" else self._server_tool_timeout
        call.deadline = now + (entry.definition.timeout or default)
        offered = self._proceed(call, now)
        self._out.do(SaveCall(call))
        if offered is not None:
            self._out.send(ToolCalls(response_id=call.response_id, calls=[offered]))

    def _client_args(
        self, call: Call, entry: ToolEntry, edited: dict[str, Any] | None, msg_id: str | None
    ) -> dict[str, Any] | None:
        """The arguments a client asks to run ``call`` with (its edit, else the model's);
        ``None`` after an ``error`` when they do not fit the tool's schema."""
        args = call.args if edited is None else edited
        if problem := entry.input_validator.problem(args):
            self._out.error(
                "invalid_message",
                f"invalid arguments: {problem}",
                in_reply_to=msg_id,
                call_id=call.call_id,
            )
            return None
        return args

    def open_confirmations(self, now: float) -> list[ConfirmItem]:
        """Calls still waiting for the user's approval, as sent in ``tool.confirm``."""
        return [
            self._confirm_item(call, now) for call in self.ledger.open_calls() if call.confirming
        ]

    def _run(self, call: Call) -> None:
        """Have the driver run server tool ``call``."""
        call.advance(CallState.RUNNING)
        if call.execution == "async":
            call.advance(CallState.PENDING)  # the model gets PENDING at once
        self._out.send(_status(call))
        self._out.do(
            RunTool(
                call_id=call.call_id,
                tool=call.tool,
                args=call.args,
                response_id=call.response_id,
                agent=self.agent,
            )
        )

    def run_on_gateway(self, msg: ToolRun, now: float) -> None:
        """Manual tool mode: run here a server tool offered to the client (``tool.run``),
        with its deadline from now; a bad request gets an ``error`` and the call stays
        the client's."""
        call = self.ledger.get(msg.call_id)
        if call is None or not call.manual:
            self._unknown_call("server-tool call offered to the client", msg.call_id, msg.id)
            return
        entry = self.tools.get(call.tool)
        if call.settled or call.kind == "server" or entry is None:
            self._out.send(_status(call, duplicate=True))  # it runs, or ran, once
            return
        args = self._client_args(call, entry, msg.args, msg.id)
        if args is None:
            return
        call.kind, call.args = "server", args
        call.deadline = now + (entry.definition.timeout or self._server_tool_timeout)
        self._run(call)
        self._out.do(SaveCall(call))

    # ----------------------------------------------------------------- outcomes

    def accept_client_result(self, result: ToolResult, msg_id: str | None) -> None:
        """Apply one entry of ``tool.results``; bad ones get an ``error``."""
        call = self.ledger.get(result.call_id)
        if call is None or call.kind != "client":
            self._unknown_call("client-function call", result.call_id, msg_id)
            return
        mismatch = echo_mismatch(result, call)
        if mismatch:
            self._out.error("invalid_result", mismatch, in_reply_to=msg_id, call_id=call.call_id)
            return
        if call.settled:
            self._out.send(_status(call, duplicate=True))
            return
        has_output = result.output is not msgspec.UNSET
        if has_output == isinstance(result.error, str):
            self._out.error(
                "invalid_result",
                "a result carries exactly one of 'output' or 'error'",
                in_reply_to=msg_id,
                call_id=call.call_id,
            )
            return
        value = result.error if isinstance(result.error, str) else result.output
        limit = self._max_result_size
        if size := oversize(value, limit):
            # Refused whole: neither the ledger nor the transcript ever holds it.
            self._out.error(
                "invalid_result",
                f"the result has {size} bytes of JSON; the limit (max_tool_result_size) is {limit}",
                in_reply_to=msg_id,
                call_id=call.call_id,
            )
            self._settle(call, CallState.FAILED, error=too_large("result", size, limit))
            return
        if isinstance(result.error, str):
            self._settle(call, CallState.FAILED, error=result.error)
            return
        problem = output_problem(self.tools.get(call.tool), call, result.output)
        if problem:
            self._out.error("invalid_result", problem, in_reply_to=msg_id, call_id=call.call_id)
            self._settle(call, CallState.FAILED, error=problem)
        else:
            self._settle(call, CallState.COMPLETED, output=result.output)

    def tool_finished(self, event: ToolFinished) -> Completion | None:
        """Settle a server tool; an async one becomes a ``Completion``."""
        call = self.ledger.get(event.call_id)
        if call is None or call.settled:
            return None  # finished after a cancel or a timeout: already settled
        limit = self._max_result_size
        if size := oversize(event.error if event.error is not None else event.output, limit):
            self._settle(call, CallState.FAILED, error=too_large("output", size, limit))
        elif event.error is not None:
            self._settle(call, CallState.FAILED, error=event.error, code=event.code)
        elif problem := output_problem(self.tools.get(call.tool), call, event.output):
            self._settle(call, CallState.FAILED, error=problem)
        else:
            self._settle(call, CallState.COMPLETED, output=event.output)
        return _completion(call)

    def tool_deferred(self, event: ToolDeferred) -> None:
        """A sync server tool will take long: its call turns async (``pending`` now, the
        model step waiting for it goes on, its outcome comes later as a completion, by
        its tool's delivery)."""
        call = self.ledger.get(event.call_id)
        if call is None or call.state is not CallState.RUNNING or call.kind != "server":
            return  # settled, async already, or not a server tool running here
        call.execution = "async"
        call.advance(CallState.PENDING)
        self._out.do(SaveCall(call))
        self._out.send(_status(call))

    def tool_handle(self, event: ToolHandle) -> None:
        """Keep where a running server tool's work can be found again (``Call.handle``);
        one over ``max_tool_result_size`` is not kept (the state stays bounded)."""
        call = self.ledger.get(event.call_id)
        if call is None or call.settled or call.kind != "server":
            return
        if oversize(event.handle, self._max_result_size):
            return
        call.handle = event.handle
        self._out.do(SaveCall(call))

    def tool_progress(self, event: ToolProgress) -> None:
        """Forward progress of a running server tool as ``tool.status progress``."""
        call = self.ledger.get(event.call_id)
        if call is None or call.settled:
            return
        status = _status(call)
        status.status = "progress"
        status.progress = event.payload
        self._out.send(status)

    def expire_due(self, now: float) -> list[Completion]:
        """Settle every call past its deadline; return the async ones' completions."""
        completions: list[Completion] = []
        for call in self.ledger.due(now):
            if call.confirming:  # nothing ran, nor was the model told it would
                call.confirming = False
                self._settle(call, CallState.EXPIRED, error="the user did not confirm in time")
                continue
            if call.kind == "client":
                self._settle(call, CallState.EXPIRED, error="the client did not answer in time")
                continue
            self._out.do(CancelTool(call.call_id))
            self._settle(
                call, CallState.FAILED, error=_LOST_ERROR if call.elsewhere else _TIMEOUT_ERROR
            )
            if (completion := _completion(call)) is not None:
                completions.append(completion)
        return completions

    def adopt(self) -> None:
        """This session was taken over from another node: the server tools running there
        are not run again here. One that kept a handle to its work (a remote agent's
        task) is re-attached to from here; the others' outcomes are routed here, or they
        fail at their deadline saying why."""
        for call in self.ledger.open_calls():
            if call.kind != "server" or not call.dispatched:
                continue
            if call.handle is None:
                call.elsewhere = True
                continue
            self._out.do(
                ResumeTool(
                    call_id=call.call_id,
                    tool=call.tool,
                    handle=call.handle,
                    response_id=call.response_id,
                    agent=self.agent,
                )
            )

    def cancel(self, call: Call, reason: str) -> None:
        """Cancel an open call (and the server tool behind it)."""
        if call.kind == "server":
            self._out.do(CancelTool(call.call_id))
        self._settle(call, CallState.CANCELLED, error=reason)

    def open_client_calls(self, now: float) -> list[ClientCall]:
        """Client-function calls still waiting for their result, as sent in ``tool.calls``."""
        return [
            client_call(call, now)
            for call in self.ledger.open_calls()
            if call.kind == "client" and not call.confirming
        ]

    def drop_all(self) -> None:
        """The session is over: cancel every open call without telling the client."""
        for call in self.ledger.open_calls():
            if call.kind == "server":
                self._out.do(CancelTool(call.call_id))
            call.advance(CallState.CANCELLED)

    @staticmethod
    def outcome(call: Call) -> ToolOutcome:
        """What the model sees as this call's result in the step that asked for it."""
        if call.execution == "async" and call.kind == "server" and call.dispatched:
            return ToolOutcome(call_id=call.call_id, name=call.tool, output=PENDING)
        return ToolOutcome(
            call_id=call.call_id, name=call.tool, output=call.output, error=call.error
        )

    # ----------------------------------------------------------------- helpers

    def _unknown_call(self, what: str, call_id: str, msg_id: str | None) -> None:
        """The ``unknown_call`` error for an answer naming no ``what`` of this session."""
        self._out.error(
            "unknown_call",
            f"no {what} with this id in this session",
            in_reply_to=msg_id,
            call_id=call_id[:128],
        )

    def _settle(
        self,
        call: Call,
        state: CallState,
        *,
        output: Any = None,
        error: str | None = None,
        code: str | None = None,
    ) -> None:
        call.advance(state)
        call.output, call.error, call.code = output, error, code
        self._out.do(SaveCall(call))
        self._out.send(_status(call))


def client_call(call: Call, now: float) -> ClientCall:
    """How a client-function call is offered to the client."""
    return ClientCall(
        call_id=call.call_id,
        tool=call.tool,
        display_name=call.display_name,
        args=call.args,
        deadline=call.deadline,
        timeout=round(max(0.0, call.deadline - now), 3),
        kind="server" if call.manual else "client",
        widget=call.widget,
    )


def _completion(call: Call) -> Completion | None:
    if call.execution != "async" or call.state is CallState.CANCELLED:
        return None
    note = completion_note(call.tool, output=call.output, error=call.error)
    return Completion(call=call, note=note)


def _status(call: Call, *, duplicate: bool = False) -> ToolStatus:
    status = ToolStatus(
        call_id=call.call_id,
        tool=call.tool,
        status=call.state.value,
        response_id=call.response_id,
        error=call.error,
        code=call.code,
        duplicate=duplicate,
    )
    if call.kind == "server" and call.state is CallState.COMPLETED:
        status.result = call.output
    return status
