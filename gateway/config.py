"""Gateway configuration: one frozen Struct, read from flags or ``GATEWAY_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec

from gateway.errors import ConfigError

__all__ = ["Config", "from_env", "load_toml"]

_ENV_PREFIX = "GATEWAY_"
T = TypeVar("T")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the gateway can be told at startup. Each field has a CLI flag."""

    host: str = "127.0.0.1"
    port: int = 8000
    agent: str | None = None
    """Path to an agent TOML file; ``None`` serves the bundled demo agent."""
    model: str | None = None
    """``provider:model`` (e.g. ``openai:gpt-4o-mini``), replacing the agent's model."""
    base_url: str | None = None
    """The model API's base URL, replacing the agent's (e.g. a local vLLM or Ollama)."""
    ws_max_size: int = 2**20
    """Largest inbound WebSocket frame in bytes; bigger frames close the socket with 1009."""
    max_message_chars: int = 32_000
    """Longest ``user.message`` text, in characters."""
    max_queued_messages: int = 8
    """User messages that may wait behind a running response before ``busy``."""
    max_steps: int = 8
    """Model steps (calls to the model) allowed in one response."""
    client_call_timeout: float = 30.0
    """Seconds a client has to answer a client-function call that sets no timeout."""
    server_tool_timeout: float = 30.0
    """Seconds a server tool may run when its definition sets no timeout."""
    first_message_timeout: float = 10.0
    """Seconds a new socket has to send its first message before it is closed (1008)."""
    session_ttl: float = 120.0
    """Seconds a session lives on after its socket is gone, waiting for ``session.resume``."""
    store: str = "memory"
    """Where sessions are kept: ``memory`` (this process; one node) or a Redis URL
    (``redis://[:password@]host:port/db``, ``rediss://`` for TLS, ``unix:///path.sock``)
    that every node of a cluster shares, so a session survives its node."""
    lease_ttl: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    """Seconds a node's lease on a session lasts unless renewed; a session whose node
    died is taken over by a resume at once, and its data outlive it by ``session_ttl``
    plus this."""
    node_id: str | None = None
    """This node's name in session leases and logs (unique per node of a cluster); by
    default ``<hostname>-<pid>-<random>``."""
    replay_max_events: int = 10_000
    """Events a session keeps for replay (the oldest go first; ``ack`` frees them sooner)."""
    replay_max_size: int = 4 * 2**20
    """Bytes of events a session keeps for replay."""
    outbound_soft_size: int = 256 * 2**10
    """Bytes queued for a slow client past which consecutive text deltas are merged."""
    outbound_hard_size: int = 4 * 2**20
    """Bytes queued for a slow client past which its socket closes with 1013 (it resumes)."""
    ws_ping_interval: float | None = 20.0
    """Seconds between WebSocket pings; ``None`` disables them."""
    ws_ping_timeout: float | None = 20.0
    """Seconds to wait for a pong before the peer counts as dead; ``None`` waits forever."""
    shutdown_timeout: float = 30.0
    """On SIGTERM, seconds running responses get to finish before they are cut."""
    scripted_pace: float | None = None
    """Seconds between words of the scripted model; ``None`` keeps the scenario's pace."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    """The event loop ``gateway serve`` runs on: ``auto`` is uvloop where it is installed
    (a dependency on Linux and macOS), else asyncio's own."""
    no_auth: bool = False
    """Serve callers without a credential (as ``anonymous``): local development only. The
    gateway refuses to start with it on a host that is not loopback. Credentials
    presented are still checked."""
    api_keys: str | None = None
    """API keys as comma-separated ``name:key`` pairs (prefer ``GATEWAY_API_KEYS`` or a
    file to the flag: flags show in ``ps``). Without any key, a gateway on a loopback host
    serves as under ``no_auth`` (with a warning) and one on any other host refuses to start."""
    api_keys_file: str | None = None
    """A file of API keys, one ``name:key`` a line (``#`` starts a comment)."""
    token_secret: str | None = None
    """The key (32 bytes or more) client tokens are signed with; the same on every node.
    ``None`` makes a random one per process: its tokens die with it."""
    token_ttl: float = 600.0
    """Seconds a client token lives unless its request asks for less (or more, up to
    ``max_token_ttl``)."""
    max_token_ttl: float = 3600.0
    """The longest lifetime, in seconds, a token request may ask for."""
    allowed_origins: str | None = None
    """Browser origins served besides the gateway's own, comma-separated
    (``https://app.example.com``); ``*`` allows any. ``None``: same-origin only."""
    allowed_hosts: str | None = None
    """``Host`` names served, comma-separated (against DNS rebinding); ``*`` allows any.
    ``None``: loopback names when bound to a loopback address, any name otherwise."""
    max_messages_per_second: Annotated[float, msgspec.Meta(gt=0)] | None = 50.0
    """Frames a socket may send per second, on average; a frame over the limit is dropped
    and answered with ``error rate_limited``. ``None`` disables the limit."""
    max_message_burst: Annotated[int, msgspec.Meta(ge=1)] | None = 100
    """Frames a socket may send at once above the rate (the token bucket's size). A client
    that sends this many more frames over the limit in a row is closed with 1008
    ("message flood"). ``None`` disables the limit."""
    max_inbound_queue: Annotated[int, msgspec.Meta(ge=1)] = 256
    """Frames read from a socket that wait for its session, at most; as many more may wait
    in the session's own queue. Past that the gateway stops reading the socket until the
    session catches up (TCP back-pressure: the client's sends block; nothing is dropped)."""
    tool_schema_max_size: int | None = 16 * 2**10
    """Largest JSON Schema (input or output) of one client function, in bytes of JSON;
    ``None`` disables the limit."""
    client_functions_max_size: int | None = 128 * 2**10
    """Bytes of JSON Schema, all of them together, that one ``session.start`` or
    ``session.update`` may declare; ``None`` disables the limit."""
    max_schema_depth: int | None = 24
    """Deepest nesting of objects and arrays in a client function's schema; ``None``
    disables the limit (keep it: deep schemas exhaust the stack)."""
    max_schema_nodes: int | None = 500
    """Object members and array items, ``$ref`` targets counted where they are used, in
    all the client-function schemas of one ``session.start`` or ``session.update``.
    Checking a new schema costs up to about 0.6 ms per node (in a worker process, off the
    event loop; see docs/limits.md). ``None`` disables the limit."""
    max_schema_pattern_length: int | None = 256
    """Longest regex (``pattern``, ``patternProperties``) in a client function's schema,
    in characters; ``None`` disables the limit."""
    max_schema_check_steps: int | None = 3_000
    """Keyword evaluations (about 10 µs each; ``enum`` counts its members, ``uniqueItems``
    the pairs of items) one check of a value against a client function's schema may take;
    a result or arguments past it fail as too large to check. ``None`` disables it."""
    max_cached_schemas: int = 256
    """Checked client-function schemas kept, compiled, for the sessions that declare them
    again (least recently used go first). Keep it at 256 or more: a declaration holds up
    to 256 schemas, and those that do not fit are checked on the event loop."""
    handshake_timeout: float | None = 10.0
    """Seconds a new connection (and each request on a kept-alive one) has to send its whole
    HTTP request: request line, headers and body, a WebSocket upgrade included. Past it the
    connection is dropped without an answer (slowloris). ``None`` disables the limit."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle HTTP keep-alive connection stays open (uvicorn's ``timeout_keep_alive``)."""
    max_connections: int | None = 16_384
    """Open connections (HTTP and WebSocket) past which new requests and upgrades get HTTP 503
    (uvicorn's ``limit_concurrency``). ``gateway serve`` raises its open-file limit to fit
    it when the system allows (and warns when it cannot). ``None`` disables the limit."""
    send_timeout: float | None = 20.0
    """Seconds one send to a WebSocket may stall (the client stopped reading) before the socket
    is closed with 1013 and dropped after ``ws_close_timeout``; the session waits for a resume.
    ``None`` waits forever (the keepalive ping still notices a dead peer)."""
    ws_close_timeout: float = 5.0
    """Seconds a closing WebSocket waits for the client's close frame; then the connection is
    aborted, which frees what the kernel still buffers for a client that does not read."""
    max_sockets_per_ip: int | None = 64
    """Open WebSockets per client address; one more is closed with 1013. The addresses of
    ``forwarded_allow_ips`` (trusted proxies: this machine by default) are not limited: behind
    them each client's forwarded address is counted. ``None`` disables the limit."""
    forwarded_allow_ips: str = "127.0.0.1,::1"
    """Comma-separated addresses or networks of proxies trusted to set ``X-Forwarded-For``
    (the client address used by ``max_sockets_per_ip``); ``*`` trusts any, an empty string
    none."""
    max_sessions: int | None = 20_000
    """Sessions this gateway holds, live and waiting for a resume; one more ``session.start``
    is closed with 1013. Size it to the node's memory (docs/limits.md). ``None`` disables
    the limit."""
    max_sessions_per_principal: int | None = 100
    """Sessions one principal (an API key, or a user of a client token) holds, live and
    waiting for a resume; one more ``session.start`` is closed with 4029. Without auth
    (loopback only) every client is ``anonymous`` and only ``max_sessions`` holds. ``None``
    disables the limit."""
    max_body_size: int | None = 64 * 2**10
    """Largest HTTP request body in bytes; a larger one gets HTTP 413 and the connection
    closes. ``None`` disables the limit."""
    max_history_chars: int | None = 200_000
    """The history a session keeps and sends the model, in characters of text plus bytes
    of JSON of tool arguments and outputs (instructions and tool schemas not counted).
    Before each model request the oldest whole turns go first; a tool call is never parted
    from its result and the turn in progress is never cut, so a turn that alone is over
    the budget is sent whole. ``None`` disables the limit (the history grows forever)."""
    max_tool_result_size: int | None = 256 * 2**10
    """Largest tool output or error, in bytes of JSON: a bigger client result is refused
    with ``error invalid_result`` and a bigger server tool output fails its call; either
    way the model gets a short tool error and nothing of the value is kept. ``None``
    disables the limit."""


def from_env(environ: Mapping[str, str] | None = None, **overrides: object) -> Config:
    """Build a Config from ``GATEWAY_*`` variables, then ``overrides`` (CLI flags).

    An unknown ``GATEWAY_*`` variable is an error, so a typo fails at startup.

    Raises:
        ConfigError: a variable is unknown or has a value of the wrong type.
    """
    env = os.environ if environ is None else environ
    raw: dict[str, object] = {
        key[len(_ENV_PREFIX) :].lower(): value
        for key, value in env.items()
        if key.startswith(_ENV_PREFIX)
    }
    raw.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid GATEWAY_* variable or flag: {exc}") from exc


def load_toml(path: Path, type_: type[T]) -> T:
    """Read a TOML file into ``type_``.

    Raises:
        ConfigError: naming the file and saying whether it is unreadable, not
            TOML, or TOML with a wrong field (with the field's path).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        return msgspec.toml.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
