"""Metering: every model step reserved against its limits before it starts, settled with
the model's real usage after, and counted for ``GET /v1/usage`` and the metrics.

``Meter`` is the node's (the limits file, the ledger, the metrics); ``SessionMeter`` one
session's (whose usage it is: the key, the end user). A step's path (``ModelStep``):

1. ``reserve``: the limits of its key, end user and agent (``Budgets.checks``) are asked
   of the ledger with an estimate (the request's characters / 4, plus the file's
   ``[estimate] output_tokens``), atomically on every node (a Redis script); a refusal
   means the step never starts. No limit applies: no I/O at all.
2. ``priced``: the step's ``ModelFinish`` gets its cost from the price table.
3. ``settle``: the reservation takes the real usage (a step cut before the model reported
   any keeps its estimate, unless it produced nothing), and the usage is recorded by key,
   end user, agent and model, in the background (the step's events are already out).

``UsageObserver`` counts what is not a model step: tool calls by kind, audio heard and
spoken; recorded at the end of each response and of the session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import msgspec
import structlog

from gateway.auth.limits import Budgets, attribution_key
from gateway.core.model import ModelFinish, ModelRequest, ModelUsage
from gateway.core.outbound import LimitHit
from gateway.core.principal import Principal
from gateway.core.usage import (
    MICRO,
    Attribution,
    Check,
    Price,
    Refusal,
    Reservation,
    Tally,
    estimate_tokens,
)
from gateway.shell.metrics import Metrics
from gateway.store.ledger import Ledger
from gateway.wire.v1 import (
    AgentTransferred,
    AudioDone,
    InputSpeechStarted,
    InputSpeechStopped,
    ResponseDone,
    ServerMsg,
    SessionCreated,
    ToolCalls,
    ToolStatus,
)

__all__ = ["Meter", "SessionMeter", "UsageObserver", "refusal_message", "step_estimate"]

log = structlog.get_logger("gateway.usage")


def step_estimate(
    request: ModelRequest, output_tokens: int, price: Price | None
) -> tuple[int, int]:
    """What a step asking ``request`` is reckoned to cost before it runs: ``(tokens,
    micro-units)`` (the cost of an unpriced model counts 0: a cost cap refuses to start
    with one, see ``Budgets.check_priced``)."""
    input_tokens = estimate_tokens(len(msgspec.json.encode(request)))
    cost = price.cost(input_tokens=input_tokens, output_tokens=output_tokens) if price else 0
    return input_tokens + output_tokens, cost or 0


def refusal_message(refusal: Refusal) -> str:
    """The ``error`` message of a step refused over a limit."""
    who = {"key": "this app's key", "end_user": "this user", "agent": "this agent"}[refusal.scope]
    what = refusal.limit.replace("_", " ")
    return f"{who} is over its {what} ({refusal.value:g}); try again in {refusal.retry_after:.0f} s"


def limit_hit(refusal: Refusal) -> LimitHit:
    return LimitHit(scope=refusal.scope, name=refusal.limit, value=refusal.value)


class Meter:
    """A node's metering.

    Args:
        budgets: the limits file (limits, prices, the estimate).
        ledger: where reservations and usage are counted (shared by the nodes on Redis).
        models: each agent's model name (``Agent.model`` or its provider's name), by agent.
        metrics: the node's metrics.
    """

    def __init__(
        self,
        budgets: Budgets,
        ledger: Ledger,
        models: Mapping[str, str],
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.budgets = budgets
        self.ledger = ledger
        self._models = models
        self.metrics = metrics
        self.clock = clock
        self._background: set[asyncio.Task[None]] = set()

    def model_of(self, agent: str) -> str:
        return self._models.get(agent, "unknown")

    def session(self, principal: Principal, agent: str) -> SessionMeter:
        """The meter of a session of ``principal``, which starts with ``agent``."""
        return SessionMeter(self, principal, agent)

    def later(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a write in the background, kept alive until it is done (a failed one is
        logged: the step's events are out already)."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("usage_not_recorded", error=str(task.exception()))

    async def drain(self) -> None:
        """Wait for the background writes (at shutdown, and for tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def now(self) -> float:
        return self.clock()


class SessionMeter:
    """One session's metering: its usage is its principal's (key and end user)."""

    def __init__(self, meter: Meter, principal: Principal, agent: str) -> None:
        self._meter = meter
        self._principal = principal
        self.agent = agent
        """The session's agent now (a hand-over changes it)."""
        self._key = attribution_key(principal)
        self._end_user = principal.user_id or ""
        self._checks: dict[str, tuple[Check, ...]] = {}

    def who(self, agent: str) -> Attribution:
        agent = agent or self.agent
        return Attribution(self._key, self._end_user, agent, self._meter.model_of(agent))

    def checks(self, agent: str) -> tuple[Check, ...]:
        checks = self._checks.get(agent)
        if checks is None:
            checks = self._checks[agent] = self._meter.budgets.checks(self._principal, agent)
        return checks

    async def reserve(self, agent: str, request: ModelRequest) -> Reservation | Refusal | None:
        """Reserve a step of ``agent`` (``""``: the session's) asking ``request``;
        ``None`` when no limit holds it (nothing asked of the ledger).

        Raises:
            StoreUnavailable: the ledger cannot be reached.
        """
        agent = agent or self.agent
        checks = self.checks(agent)
        if not checks:
            return None
        meter = self._meter
        budgets = meter.budgets
        tokens, cost = step_estimate(
            request, budgets.spec.estimate.output_tokens, budgets.price(meter.model_of(agent))
        )
        outcome = await meter.ledger.reserve(checks, tokens=tokens, cost=cost, now=meter.now())
        if isinstance(outcome, Refusal):
            meter.metrics.note_usage_refusal(outcome.code, outcome.scope, outcome.limit)
            log.info(
                "usage_refused",
                code=outcome.code,
                scope=outcome.scope,
                limit=outcome.limit,
                retry_after=round(outcome.retry_after, 3),
            )
        return outcome

    def cost(self, agent: str, usage: ModelUsage) -> int | None:
        """What ``usage`` of ``agent``'s model cost, in micro-units (``None``: unknown)."""
        price = self._meter.budgets.price(self._meter.model_of(agent or self.agent))
        if price is None:
            return None
        return price.cost(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            input_audio_tokens=usage.input_audio_tokens,
            output_audio_tokens=usage.output_audio_tokens,
        )

    def priced(self, agent: str, finish: ModelFinish) -> ModelFinish:
        """``finish`` with its usage's cost (in the currency's units)."""
        usage = finish.usage
        if usage is None:
            return finish
        cost = self.cost(agent, usage)
        usage = msgspec.structs.replace(usage, cost=None if cost is None else cost / MICRO)
        return msgspec.structs.replace(finish, usage=usage)

    def settle(
        self,
        agent: str,
        reservation: Reservation | None,
        usage: ModelUsage | None,
        *,
        produced: bool,
    ) -> None:
        """The step is over: settle its reservation and record its usage, in the
        background. ``produced``: the model said something (a step that failed before
        that gives its reservation back; one cut after keeps its estimate)."""
        agent = agent or self.agent
        meter = self._meter
        cost = self.cost(agent, usage) if usage is not None else None
        if reservation is not None:
            if usage is not None:
                tokens, charged = usage.input_tokens + usage.output_tokens, cost or 0
            elif produced:
                tokens, charged = reservation.tokens, reservation.cost
            else:
                tokens, charged = 0, 0
            meter.later(meter.ledger.settle(reservation, tokens=tokens, cost=charged))
        who = self.who(agent)
        tally = Tally(steps=1)
        if usage is not None:
            tally.input_tokens = usage.input_tokens
            tally.output_tokens = usage.output_tokens
            tally.cached_input_tokens = usage.cached_input_tokens
            tally.input_audio_tokens = usage.input_audio_tokens
            tally.output_audio_tokens = usage.output_audio_tokens
            if cost is None:
                tally.unpriced_steps = 1
            else:
                tally.cost = cost
            meter.metrics.note_step(
                who.agent,
                who.model,
                {
                    "input": usage.input_tokens,
                    "output": usage.output_tokens,
                    "cached_input": usage.cached_input_tokens,
                    "input_audio": usage.input_audio_tokens,
                    "output_audio": usage.output_audio_tokens,
                },
                cost,
            )
        meter.later(meter.ledger.record(who, tally, now=meter.now()))

    def record(self, tally: Tally) -> None:
        """Record usage other than a model step's (tool calls, audio), for the session's
        agent now."""
        if tally.counters():
            meter = self._meter
            meter.later(meter.ledger.record(self.who(""), tally, now=meter.now()))


class UsageObserver:
    """Counts a session's tool calls by kind and its audio, from the events it sends;
    recorded with each ``response.done`` and ``audio.done``, and at the end
    (``gateway.shell.observe``)."""

    def __init__(self, meter: SessionMeter) -> None:
        self._meter = meter
        self._tally = Tally()
        self._speech_from: int | None = None

    def started(self, now: float) -> None:
        pass

    def sent(self, msg: ServerMsg, now: float) -> None:
        match msg:
            case ToolCalls(calls=calls):
                self._count("client", len(calls))
            case ToolStatus(status="running" | "pending" as status, duplicate=False):
                self._count("server" if status == "running" else "async", 1)
            case AudioDone(audio_ms=audio_ms):  # often after its response.done
                self._tally.audio_out_ms += audio_ms
                self._flush()
            case InputSpeechStarted(offset_ms=offset):
                self._speech_from = offset
            case InputSpeechStopped(offset_ms=offset) if self._speech_from is not None:
                self._tally.audio_in_ms += max(offset - self._speech_from, 0)
                self._speech_from = None
            case SessionCreated(agent=agent) | AgentTransferred(agent=agent) if agent:
                self._flush()
                self._meter.agent = agent
            case ResponseDone():
                self._flush()
            case _:
                pass

    def _count(self, kind: str, n: int) -> None:
        calls = self._tally.tool_calls
        calls[kind] = calls.get(kind, 0) + n

    def _flush(self) -> None:
        tally, self._tally = self._tally, Tally()
        self._meter.record(tally)

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        pass

    def detached(self, *, ended: bool, now: float) -> None:
        pass

    def ended(self, now: float) -> None:
        self._flush()
