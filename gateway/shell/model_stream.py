"""One model step, streamed into its session.

A step's events go to the session's loop as ``ModelOutput``; but while that loop has
nothing to do (it waits on an empty queue), the step applies a text to the core itself, in
order, and has it committed and written at once (the short path of every delta, see
``gateway.shell.driver``). A provider either streams (``Provider.stream``: this step's task
reads it) or pushes (``Pushes``: the provider's own callbacks hand events to ``take``).

Before the provider is asked, the step is reserved against its usage limits (``meter``,
``gateway.shell.meter``): over one, it never starts and fails with ``rate_limited`` or
``budget_exceeded``; after it, its reservation is settled with the model's usage.

Nothing the model sends may end the session: whatever fails here fails the step, and so the
response. Text is carried whole: an emoji the server cut in two is put back together
(``SurrogatePairer``), and text no socket can carry fails the step.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Protocol, cast, runtime_checkable

import structlog

from gateway.core.event import CallModel, Event, ModelFailed, ModelOutput
from gateway.core.model import ModelEvent, ModelFinish, ModelText, ModelUsage
from gateway.core.text import SurrogatePairer, uncarriable
from gateway.core.usage import Refusal
from gateway.errors import ProviderError, StoreUnavailable
from gateway.providers.base import Provider, Pushes
from gateway.shell.inbox import Backlog
from gateway.shell.meter import SessionMeter, limit_hit, refusal_message
from gateway.shell.rounds import ROUNDS

__all__ = ["ModelStep"]

log = structlog.get_logger("gateway.driver")

_YIELD_FIRST = 4
_YIELD_EVERY = 16
"""A model step's reader hands the loop over after each of its first ``_YIELD_FIRST``
events, then every this many it reads in one round of the loop (a burst; a paced stream
gives the loop back between its events anyway). ``bench/first_delta.py``: a 500-chunk
burst's first delta reaches the client 8 ms after the request, 25 ms without."""


@runtime_checkable
class Refusable(Protocol):
    """A model that may have begun an answer on its own (a speech-to-speech upstream that
    answers speech): told when the step it would be is refused."""

    def refuse(self) -> None: ...


@functools.cache
def _pushes(kind: type) -> bool:
    """Whether providers of ``kind`` push (once per class: a protocol's ``isinstance``
    costs tens of microseconds)."""
    return issubclass(kind, Pushes)


class ModelStep:
    """Feeds the model's events for one step (``CallModel``) to the session.

    Args:
        effect: the step the core asked for.
        provider: the model of the agent the step is for.
        backlog: counts the model events waiting in the session's queue.
        idle: whether the session's loop waits on an empty queue with a store that commits
            at once: a text may then be applied here (the short path).
        take_text: applies a text of the step to the session (on the short path).
        flush_soon: commits and writes what the short path applied.
        feed: queues an event for the session's loop.
        meter: the session's metering (``None``: none, as in tests of the driver alone).
    """

    __slots__ = (
        "_backlog",
        "_effect",
        "_feed",
        "_flush_soon",
        "_idle",
        "_meter",
        "_pairer",
        "_provider",
        "_take_text",
        "failed",
        "finished",
        "produced",
        "usage",
    )

    def __init__(
        self,
        effect: CallModel,
        provider: Provider,
        *,
        backlog: Backlog,
        idle: Callable[[], bool],
        take_text: Callable[[str, str], None],
        flush_soon: Callable[[], None],
        feed: Callable[[Event], None],
        meter: SessionMeter | None = None,
    ) -> None:
        self._effect = effect
        self._meter = meter
        self._provider = provider
        self._backlog = backlog
        self._idle = idle
        self._take_text = take_text
        self._flush_soon = flush_soon
        self._feed = feed
        self._pairer = SurrogatePairer()  # an emoji cut in two must not end anything
        self.finished = False
        """A pushing provider gave the step's ``ModelFinish``."""
        self.failed = False
        """A pushed event could not be carried: the step has failed."""
        self.produced = False
        """The model said something in this step (what a cut step is charged by)."""
        self.usage: ModelUsage | None = None
        """The model's usage, from the step's ``ModelFinish``."""

    async def run(self) -> None:
        """Stream the step to its end (the task of a ``CallModel``)."""
        meter = self._meter
        if meter is None:
            await self._run()
            return
        effect = self._effect
        try:
            reserved = await meter.reserve(effect.agent, effect.request)
        except Exception as exc:  # the store down, or our bug: the step is not started
            if isinstance(exc, StoreUnavailable):
                log.warning("usage_unavailable", response_id=effect.response_id, error=str(exc))
            else:
                log.exception("usage_check_crashed", response_id=effect.response_id)
            self._feed(
                ModelFailed(
                    effect.step_id,
                    "usage limits cannot be checked now",
                    code="usage_unavailable",
                )
            )
            return
        if isinstance(reserved, Refusal):
            if isinstance(self._provider, Refusable):  # a speech-to-speech session's step
                self._provider.refuse()
            self._feed(
                ModelFailed(
                    effect.step_id,
                    refusal_message(reserved),
                    code=reserved.code,
                    retry_after=round(reserved.retry_after, 3),
                    limit=limit_hit(reserved),
                )
            )
            return
        try:
            await self._run()
        finally:  # cancelled too (barge-in, response.cancel): what was used is counted
            meter.settle(effect.agent, reserved, self.usage, produced=self.produced)

    async def _run(self) -> None:
        effect = self._effect
        step_id = effect.step_id
        provider = self._provider
        try:
            played = None
            if _pushes(type(provider)):
                played = cast(Pushes, provider).push(effect.request, self.take, self._backlog)
            if played is not None:
                await played
                finished = self.finished or self.failed
            else:
                finished = await self._pull()
        except ProviderError as exc:
            log.warning("model_failed", response_id=effect.response_id, error=str(exc))
            self._feed(ModelFailed(step_id, f"the model failed: {exc}", retryable=exc.retryable))
            return
        except Exception:
            log.exception("model_crashed", response_id=effect.response_id)
            self._feed(ModelFailed(step_id, "the model failed unexpectedly"))
            return
        if not finished:
            self._feed(ModelFailed(step_id, "the model stream ended before it finished"))

    async def _pull(self) -> bool:
        """``run`` for a model that streams: ``False`` when its stream ended before it
        finished (``True`` too when the step failed: it is over)."""
        step_id = self._effect.step_id
        # Bound once: the loop below runs for every delta.
        idle, take_text, flush_soon = self._idle, self._take_text, self._flush_soon
        pairer, backlog = self._pairer, self._backlog
        loop = asyncio.get_running_loop()
        fed = burst = 0
        seen_round = -1
        async for received in self._provider.stream(self._effect.request):
            self.produced = True
            if (
                type(received) is ModelText
                and not pairer.held
                and received.text.isascii()
                and idle()
            ):
                # Most events: the short path (the loop is idle, so applying the text
                # here keeps the order and saves two task switches per delta), for a
                # text the surrogate pairer would pass untouched.
                take_text(step_id, received.text)
                flush_soon()
            elif not self._feed_model(received):
                return True
            fed += 1
            round_ = ROUNDS.current(loop)
            if round_ != seen_round:
                seen_round, burst = round_, 0
            burst += 1
            if fed <= _YIELD_FIRST or burst % _YIELD_EVERY == 0:
                # A burst parsed from one read never yields on its own: hand the loop
                # to the session and its socket's writer now and then, and after each
                # of the step's first events (the first delta takes a few turns of
                # the loop to reach the socket), so it goes out before the rest is read.
                # A paced stream yields between its events anyway: no extra turn.
                await asyncio.sleep(0)
            if backlog.full:
                await backlog.room.wait()  # a fast model waits for the session
            if type(received) is ModelFinish:
                return True
        return False

    def take(self, events: list[ModelEvent]) -> bool:
        """The sink a provider that pushes (``Pushes``) gives the step's events to: the
        same paths as ``_pull``'s loop, called from the provider's callbacks; ``False``
        once the step has failed (stop).

        The loop keeps its own copy of these few lines: calling ``take`` for each streamed
        event cost the fan-out a fifth of its rate (measured, 3 interleaved repeats)."""
        step_id = self._effect.step_id
        applied = False
        self.produced = True
        for received in events:
            if (
                type(received) is ModelText
                and not self._pairer.held
                and received.text.isascii()
                and self._idle()
            ):
                self._take_text(step_id, received.text)  # the short path
                applied = True
            elif not self._feed_model(received):
                self.failed = True
                return False
            if type(received) is ModelFinish:
                self.finished = True
        if applied:
            self._flush_soon()  # all of them in one write
        return True

    def _feed_model(self, received: ModelEvent) -> bool:
        """Feed one event of the model (what the pairer makes of it) to the session;
        ``False`` when it cannot be carried (the step has failed)."""
        step_id = self._effect.step_id
        if type(received) is ModelFinish:
            self.usage = received.usage
            if self._meter is not None:
                received = self._meter.priced(self._effect.agent, received)
        for event in self._pairer.events(received):
            if type(event) is ModelText and self._idle():
                self._take_text(step_id, event.text)  # the short path, as above
                self._flush_soon()
                continue
            problem = uncarriable(event)
            if problem is not None:
                log.warning("model_output_refused", response_id=self._effect.response_id)
                self._feed(ModelFailed(step_id, problem, retryable=False))
                return False
            self._backlog.add()
            self._feed(ModelOutput(step_id, event))
        return True
