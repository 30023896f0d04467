"""Prometheus metrics of one gateway, fed by observers of its sessions.

Every ``Runtime`` has its own ``Metrics`` on its own registry (never the global one):
tests build many gateways in one process, and two apps in one process must not mix
their counts. ``MetricsObserver`` watches one session (see ``gateway.shell.observe``); the
runtime reports refused connections and the providers report retries.

Labels are bounded sets (event types, error codes, refusal labels, call statuses), never
ids or user data, so the number of series stays small whatever the traffic.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.wire.v1 import (
    Error,
    ResponseCreated,
    ResponseDone,
    ServerMsg,
    SessionCreated,
    SessionUpdated,
    TextDelta,
    ToolCalls,
    ToolStatus,
)

__all__ = ["CONTENT_TYPE", "Metrics", "MetricsObserver"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The content type of ``Metrics.render()`` (Prometheus text format)."""

# Streaming starts within a second or two when all is well; tools may take minutes.
_FIRST_DELTA_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_OPEN_STATUSES = ("requested", "running", "pending", "progress")


def _tag(msg_type: type[ServerMsg]) -> str:
    tag = msg_type.__struct_config__.tag
    return tag if isinstance(tag, str) else msg_type.__name__


class _EventsSent(Collector):
    """``gateway_events_sent_total{type}``, counted in a plain dict and read at scrape time:
    it is bumped for every event, deltas included, and a prometheus ``Counter`` takes a
    lock per increment."""

    def __init__(self) -> None:
        self.counts: dict[type[ServerMsg], int] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gateway_events_sent",
            "Server events sent by sessions (replays not counted again), by type.",
            labels=["type"],
        )
        for msg_type, count in list(self.counts.items()):
            family.add_metric([_tag(msg_type)], count)
        yield family


class Metrics:
    """The metrics of one gateway, on a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.sessions_live = Gauge(
            "gateway_sessions_live",
            "Sessions running on this node, attached to a socket or not.",
            registry=registry,
        )
        self.sessions_detached = Gauge(
            "gateway_sessions_detached",
            "Live sessions without a socket, waiting for a resume (session_ttl).",
            registry=registry,
        )
        self.sockets_attached = Gauge(
            "gateway_sockets_attached",
            "WebSockets attached to a session.",
            registry=registry,
        )
        self.sessions_started = Counter(
            "gateway_sessions_started", "Sessions started.", registry=registry
        )
        self.attaches = Counter(
            "gateway_socket_attaches",
            "Sockets attached to a session: kind is new, resume or takeover.",
            ["kind"],
            registry=registry,
        )
        self._attaches_by_kind: dict[str, Counter] = {}
        self._events_sent = _EventsSent()
        registry.register(self._events_sent)
        self.errors_sent = Counter(
            "gateway_errors_sent", "error events sent, by code.", ["code"], registry=registry
        )
        self.responses = Counter(
            "gateway_responses", "Responses finished, by status.", ["status"], registry=registry
        )
        self.first_delta = Histogram(
            "gateway_time_to_first_delta_seconds",
            "From response.created to the response's first text.delta.",
            buckets=_FIRST_DELTA_BUCKETS,
            registry=registry,
        )
        self.tool_latency = Histogram(
            "gateway_tool_latency_seconds",
            "From a tool call to its settled tool.status, by kind and final status.",
            ["kind", "status"],
            buckets=_TOOL_BUCKETS,
            registry=registry,
        )
        self.provider_retries = Counter(
            "gateway_provider_retries",
            "Model requests retried before their first event, by provider and reason.",
            ["provider", "reason"],
            registry=registry,
        )
        self.connections_rejected = Counter(
            "gateway_connections_rejected",
            "WebSocket connections refused, by reason (the refusal's label).",
            ["reason"],
            registry=registry,
        )
        self.sessions_adopted = Counter(
            "gateway_sessions_adopted",
            "Sessions this node took over from the store (another node drove them before).",
            registry=registry,
        )
        self.sessions_moved = Counter(
            "gateway_sessions_moved",
            "Sessions that left this node alive: taken over elsewhere, or handed over at shutdown.",
            registry=registry,
        )
        # Metering (docs/usage.md): by agent and model, never by key or end user (cardinality).
        self.model_tokens = Counter(
            "gateway_model_tokens",
            "Model tokens as the providers reported them, by agent, model and kind "
            "(input, output, cached_input, input_audio, output_audio).",
            ["agent", "model", "kind"],
            registry=registry,
        )
        self.model_steps = Counter(
            "gateway_model_steps",
            "Model steps run, by agent and model.",
            ["agent", "model"],
            registry=registry,
        )
        self.model_cost = Counter(
            "gateway_model_cost",
            "Cost of the priced model steps, in the price table's currency, by agent and model.",
            ["agent", "model"],
            registry=registry,
        )
        self.model_steps_unpriced = Counter(
            "gateway_model_steps_unpriced",
            "Model steps whose cost is unknown (their model has no price), by agent and model.",
            ["agent", "model"],
            registry=registry,
        )
        self.usage_refusals = Counter(
            "gateway_usage_refusals",
            "Model steps not started over a usage limit, by code, scope and limit.",
            ["code", "scope", "limit"],
            registry=registry,
        )

    def observer(self) -> MetricsObserver:
        """A new observer for one session."""
        return MetricsObserver(self)

    def count_sent(self, msg_type: type[ServerMsg]) -> None:
        """Count one sent event of ``msg_type``."""
        counts = self._events_sent.counts
        counts[msg_type] = counts.get(msg_type, 0) + 1

    def count_attach(self, kind: str) -> None:
        """Count a socket attached to a session (``kind``: new, resume or takeover)."""
        child = self._attaches_by_kind.get(kind)
        if child is None:  # labels() validates and locks: once per kind, not per socket
            child = self._attaches_by_kind[kind] = self.attaches.labels(kind=kind)
        child.inc()

    def note_refusal(self, label: str) -> None:
        """Count a refused connection (``label`` is a short snake_case reason)."""
        self.connections_rejected.labels(reason=label).inc()

    def note_retry(self, provider: str, reason: str) -> None:
        """Count a retried model request (``reason``: ``http_429``, ``ConnectError``...)."""
        self.provider_retries.labels(provider=provider, reason=reason).inc()

    def note_adoption(self) -> None:
        self.sessions_adopted.inc()

    def note_moved(self) -> None:
        self.sessions_moved.inc()

    def note_step(self, agent: str, model: str, tokens: dict[str, int], cost: int | None) -> None:
        """Count a model step's usage (``cost`` in micro-units; ``None``: unknown)."""
        self.model_steps.labels(agent=agent, model=model).inc()
        for kind, count in tokens.items():
            if count:
                self.model_tokens.labels(agent=agent, model=model, kind=kind).inc(count)
        if cost is None:
            self.model_steps_unpriced.labels(agent=agent, model=model).inc()
        elif cost:
            self.model_cost.labels(agent=agent, model=model).inc(cost / 1_000_000)

    def note_usage_refusal(self, code: str, scope: str, limit: str) -> None:
        self.usage_refusals.labels(code=code, scope=scope, limit=limit).inc()

    def render(self) -> bytes:
        """The metrics in Prometheus' text format (content type ``CONTENT_TYPE``)."""
        return generate_latest(self.registry)


class MetricsObserver:
    """Feeds ``Metrics`` from one session's events (a ``SessionObserver``).

    Keeps only what is open: responses without their first delta yet and calls not
    settled yet, each dropped when it ends, so its memory is bounded by the session's.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._attached = False
        self._live = False
        self._kinds: dict[str, str] = {}
        """Tool name -> ``client``/``server``, from session.created and session.updated."""
        self._awaiting_delta: dict[str, float] = {}
        self._calls: dict[str, tuple[str, float]] = {}
        """Open calls: call id -> (kind, when called)."""

    def started(self, now: float) -> None:
        self._live = True
        self._metrics.sessions_live.inc()
        self._metrics.sessions_detached.inc()  # until its first socket attaches
        self._metrics.sessions_started.inc()

    def attached(self, *, resumed: bool, replaced: bool, now: float) -> None:
        kind = "takeover" if replaced else "resume" if resumed else "new"
        self._metrics.count_attach(kind)
        if not self._attached:
            self._attached = True
            self._metrics.sessions_detached.dec()
            self._metrics.sockets_attached.inc()

    def detached(self, *, ended: bool, now: float) -> None:
        if self._attached:
            self._attached = False
            self._metrics.sockets_attached.dec()
            self._metrics.sessions_detached.inc()

    def ended(self, now: float) -> None:
        if not self._live:
            return
        self._live = False
        self._metrics.sessions_live.dec()
        if self._attached:
            self._metrics.sockets_attached.dec()
        else:
            self._metrics.sessions_detached.dec()
        self._attached = False
        self._awaiting_delta.clear()
        self._calls.clear()

    def sent(self, msg: ServerMsg, now: float) -> None:
        metrics = self._metrics
        metrics.count_sent(type(msg))
        if type(msg) is TextDelta:  # the hot path: one check, then done
            if self._awaiting_delta and msg.response_id in self._awaiting_delta:
                metrics.first_delta.observe(now - self._awaiting_delta.pop(msg.response_id))
            return
        match msg:
            case SessionCreated(tools=tools) | SessionUpdated(tools=tools):
                self._kinds = {tool.name: tool.kind for tool in tools}
            case ResponseCreated(response_id=response_id):
                self._awaiting_delta[response_id] = now
            case ResponseDone(response_id=response_id, status=status):
                self._awaiting_delta.pop(response_id, None)
                metrics.responses.labels(status=status).inc()
            case ToolCalls(calls=calls):
                for call in calls:
                    self._calls[call.call_id] = ("client", now)
            case ToolStatus(call_id=call_id, status=status) if status in _OPEN_STATUSES:
                self._calls.setdefault(call_id, ("server", now))
            case ToolStatus(call_id=call_id, status=status, duplicate=False):
                # A call that failed before it ran (unknown tool, bad arguments) was never
                # open: it settled the moment it was made.
                kind, called = self._calls.pop(call_id, (self._kinds.get(msg.tool, "unknown"), now))
                metrics.tool_latency.labels(kind=kind, status=status).observe(now - called)
            case Error(code=code):
                metrics.errors_sent.labels(code=code).inc()
            case _:
                pass
