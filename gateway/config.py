"""Gateway configuration: one frozen Struct, read from flags or ``GATEWAY_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta

from gateway.errors import ConfigError

__all__ = ["Config", "from_env", "load_toml"]

_ENV_PREFIX = "GATEWAY_"
T = TypeVar("T")


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything the gateway can be told at startup. Each field has a CLI flag.

    A field's ``Meta(description=...)`` is one sentence, its flag's line in ``gateway serve
    --help``; the docstring under it, where there is one, says more.
    """

    host: Annotated[
        str,
        Meta(description="Address to listen on; any but a loopback one needs API keys."),
    ] = "127.0.0.1"
    port: Annotated[int, Meta(description="TCP port to listen on; 0 picks a free one.")] = 8000
    agent: Annotated[
        str | None,
        Meta(description="The agent TOML file to serve; unset serves the bundled demo agent."),
    ] = None
    limits: Annotated[
        str | None,
        Meta(description="A TOML file of usage limits and model prices (docs/usage.md)."),
    ] = None
    """Limits per API key, end user and agent (tokens and requests per minute, cost per day
    and month, concurrent sessions), checked before every model step; prices per model.
    Without it, usage is still counted (``GET /v1/usage``), nothing is limited and costs
    are unknown."""
    a2a: Annotated[
        bool,
        Meta(description="Serve the agent over A2A too: its agent card and a JSON-RPC endpoint."),
    ] = False
    """Also on with ``a2a = true`` in the agent file. The card is at
    ``/.well-known/agent-card.json``, the endpoint at ``/a2a`` (docs/a2a.md)."""
    public_url: Annotated[
        str | None,
        Meta(description="The gateway's public base URL, for links it hands out (the A2A card)."),
    ] = None
    """``https://gateway.example.com``; unset, links are made from each request's own URL
    (right unless a proxy rewrites the host or the path)."""
    model: Annotated[
        str | None,
        Meta(description="The model, provider:model (openai:gpt-4o-mini), replacing the agent's."),
    ] = None
    base_url: Annotated[
        str | None,
        Meta(description="Base URL of the model's API (vLLM, Ollama...), replacing the agent's."),
    ] = None
    """For a local vLLM, Ollama or llama.cpp server (docs/providers.md)."""
    ws_max_size: Annotated[
        int,
        Meta(description="Largest inbound WebSocket frame in bytes; bigger ones close with 1009."),
    ] = 2**20
    max_message_chars: Annotated[
        int,
        Meta(description="Longest user.message text, in characters (longer: message_too_large)."),
    ] = 32_000
    max_queued_messages: Annotated[
        int,
        Meta(description="User messages that may wait behind a running response (more: busy)."),
    ] = 8
    max_steps: Annotated[
        int,
        Meta(description="Model steps (calls to the model) allowed in one response."),
    ] = 8
    """A response whose last allowed step still asks for tools ends ``incomplete`` after
    ``error max_steps_exceeded``."""
    client_call_timeout: Annotated[
        float,
        Meta(description="Seconds a client has to answer a call to a function with no timeout."),
    ] = 30.0
    """Past it the call gets ``tool.status expired``."""
    server_tool_timeout: Annotated[
        float,
        Meta(description="Seconds a server tool may run when its definition sets no timeout."),
    ] = 30.0
    """Async tools included: one that may take longer needs its own ``timeout``."""
    first_message_timeout: Annotated[
        float,
        Meta(
            description="Seconds a new socket has to send its first message, or it closes (1008)."
        ),
    ] = 10.0
    session_ttl: Annotated[
        float,
        Meta(description="Seconds a session waits for session.resume after its socket is gone."),
    ] = 120.0
    store: Annotated[
        str,
        Meta(description="Where sessions live: memory (this process) or a Redis URL nodes share."),
    ] = "memory"
    """A Redis URL is ``redis://[:password@]host:port/db``, ``rediss://`` for TLS or
    ``unix:///path.sock``; every node of a cluster shares it, so a session survives its node
    (docs/scaling.md)."""
    lease_ttl: Annotated[
        float,
        Meta(gt=0, description="Seconds a node's lease on a session lasts unless renewed."),
    ] = 10.0
    """A session whose node died is taken over by a resume at once, and its data outlive it
    by ``session_ttl`` plus this."""
    node_id: Annotated[
        str | None,
        Meta(description="This node's name in session leases and logs, unique in a cluster."),
    ] = None
    """By default ``<hostname>-<pid>-<random>``."""
    replay_max_events: Annotated[
        int,
        Meta(description="Events a session keeps for replay after a drop; the oldest go first."),
    ] = 10_000
    """``ack`` frees them sooner; a resume from before the oldest kept gets ``resume_gap``."""
    replay_max_size: Annotated[
        int,
        Meta(description="Bytes of events a session keeps for replay after a drop."),
    ] = 4 * 2**20
    outbound_soft_size: Annotated[
        int,
        Meta(description="Bytes queued for a slow client past which its text deltas are merged."),
    ] = 256 * 2**10
    """Consecutive ``text.delta`` events only."""
    outbound_hard_size: Annotated[
        int,
        Meta(description="Bytes queued for a slow client past which its socket closes with 1013."),
    ] = 4 * 2**20
    """The client resumes and gets what it missed from the replay log."""
    ws_ping_interval: Annotated[
        float | None,
        Meta(description="Seconds between WebSocket keepalive pings."),
    ] = 20.0
    """``None`` disables them."""
    ws_ping_timeout: Annotated[
        float | None,
        Meta(description="Seconds a peer has to answer a ping before its socket closes (1013)."),
    ] = 20.0
    """A silent peer counts as dead and its session waits for a resume; ``None`` waits
    forever."""
    shutdown_timeout: Annotated[
        float,
        Meta(description="On SIGTERM, seconds running responses get to finish before being cut."),
    ] = 30.0
    max_socket_age: Annotated[
        Annotated[float, Meta(gt=0)] | None,
        Meta(
            description="Seconds a socket may live before its client is moved to a new one.",
        ),
    ] = None
    """Bounds how long one socket holds a node (a load balancer's connection limit, long
    sockets pinning a node that is being drained slowly): ``going_away_notice`` seconds
    before, the gateway sends ``session.going_away``, and at that age closes the socket with
    1013; the SDKs resume on a new socket at the notice, so the conversation sees no gap.
    Unset: sockets live as long as their clients keep them."""
    going_away_notice: Annotated[
        float,
        Meta(
            ge=0,
            description="Seconds of notice (session.going_away) before max_socket_age.",
        ),
    ] = 10.0
    voice: Annotated[
        str,
        Meta(description="Speech engines for audio: offline, remote, off, or a module:function."),
    ] = "offline"
    """'offline' (pocketsphinx, piper, Silero: the voice extra) without the extra installed is
    'off'; 'remote' speaks the OpenAI-compatible audio API at ``voice_url`` (docs/voice.md)."""
    voice_workers: Annotated[
        int,
        Meta(ge=1, le=64, description="Worker processes for the speech engines."),
    ] = 2
    """Started with the first session that turns audio on."""
    voice_prestart: Annotated[
        bool,
        Meta(description="Start the speech workers with the gateway, not at the first audio."),
    ] = False
    """``make run`` sets it, so the demo page answers the microphone at once."""
    voice_names: Annotated[
        str,
        Meta(description="The voices of the speech engines, comma-separated, the default first."),
    ] = ""
    """Empty: the engines' own (``joe`` offline, ``alloy`` remote, ``default`` a factory's)."""
    voice_url: Annotated[
        str | None,
        Meta(description="The OpenAI-compatible audio API of voice=remote, ending in /v1."),
    ] = None
    voice_api_key: Annotated[
        str | None,
        Meta(description="The API key of voice_url; prefer the environment to the flag."),
    ] = None
    voice_stt_model: Annotated[
        str,
        Meta(description="The speech-to-text model of voice=remote."),
    ] = "whisper-1"
    voice_tts_model: Annotated[
        str,
        Meta(description="The text-to-speech model of voice=remote."),
    ] = "tts-1"
    scripted_pace: Annotated[
        float | None,
        Meta(description="Seconds between words of the scripted model; unset: the agent's pace."),
    ] = None
    """``0`` streams at once, for tests."""
    log_level: Annotated[
        Literal["debug", "info", "warning", "error"],
        Meta(description="The lowest level of the log lines written to stderr."),
    ] = "info"
    """Lines are JSON, or a readable rendering when stderr is a terminal (docs/operations.md)."""
    loop: Annotated[
        Literal["auto", "uvloop", "asyncio"],
        Meta(description="The event loop: auto is uvloop where it is installed, else asyncio's."),
    ] = "auto"
    """uvloop is a dependency on Linux and macOS (docs/performance.md)."""
    no_auth: Annotated[
        bool,
        Meta(description="Serve callers without a credential, as anonymous: loopback hosts only."),
    ] = False
    """For local development. The gateway refuses to start with it on a host that is not
    loopback; what becomes of a credential presented anyway is in docs/security.md."""
    api_keys: Annotated[
        str | None,
        Meta(description="API keys as comma-separated name:key pairs; prefer the env var."),
    ] = None
    """Prefer ``GATEWAY_API_KEYS`` or a file to the flag: flags show in ``ps``. Without any
    key, a gateway on a loopback host serves as under ``no_auth`` (with a warning) and one on
    any other host refuses to start."""
    api_keys_file: Annotated[
        str | None,
        Meta(description="A file of API keys, one name:key a line (# starts a comment)."),
    ] = None
    token_secret: Annotated[
        str | None,
        Meta(description="The key (32+ bytes) that signs client tokens, the same on every node."),
    ] = None
    """``None`` makes a random one per process: its tokens die with it."""
    token_ttl: Annotated[
        float,
        Meta(description="Seconds a client token lives unless its request asks for another time."),
    ] = 600.0
    """A request may ask for less, or for more up to ``max_token_ttl``."""
    max_token_ttl: Annotated[
        float,
        Meta(description="The longest lifetime, in seconds, a client token request may ask for."),
    ] = 3600.0
    allowed_origins: Annotated[
        str | None,
        Meta(description="Browser origins served besides our own, comma-separated; * allows any."),
    ] = None
    """For example ``https://app.example.com``. ``None``: same-origin only."""
    allowed_hosts: Annotated[
        str | None,
        Meta(description="Host names served, comma-separated (against DNS rebinding); * any."),
    ] = None
    """``None``: loopback names when bound to a loopback address, any name otherwise."""
    max_messages_per_second: Annotated[
        Annotated[float, Meta(gt=0)] | None,
        Meta(description="Frames a socket may send per second, on average (more: rate_limited)."),
    ] = 50.0
    """A frame over the limit is dropped and answered with ``error rate_limited``. ``None``
    disables the limit."""
    max_message_burst: Annotated[
        Annotated[int, Meta(ge=1)] | None,
        Meta(description="Frames a socket may send at once above the rate (the bucket's size)."),
    ] = 100
    """A client that sends this many more frames over the limit in a row is closed with
    1008 ("message flood"). ``None`` disables the limit."""
    max_inbound_queue: Annotated[
        int,
        Meta(ge=1, description="Frames read from a socket that may wait for its session."),
    ] = 256
    """As many more may wait in the session's own queue. Past that the gateway stops reading
    the socket until the session catches up (TCP back-pressure: the client's sends block;
    nothing is dropped)."""
    tool_schema_max_size: Annotated[
        int | None,
        Meta(description="Largest JSON Schema of one client function, in bytes of JSON."),
    ] = 16 * 2**10
    """Its input or its output schema. ``None`` disables the limit."""
    client_functions_max_size: Annotated[
        int | None,
        Meta(description="Bytes of JSON Schema one session.start or session.update may hold."),
    ] = 128 * 2**10
    """All the client functions' schemas together. ``None`` disables the limit."""
    max_schema_depth: Annotated[
        int | None,
        Meta(description="Deepest nesting of objects and arrays in a client function's schema."),
    ] = 24
    """``None`` disables the limit (keep it: deep schemas exhaust the stack)."""
    max_schema_nodes: Annotated[
        int | None,
        Meta(description="Schema nodes in all the client functions of one declaration."),
    ] = 500
    """Object members and array items, ``$ref`` targets counted where they are used, in all
    the client-function schemas of one ``session.start`` or ``session.update``. Checking a new
    schema costs up to about 0.6 ms per node (in a worker process, off the event loop; see
    docs/limits.md). ``None`` disables the limit."""
    max_schema_pattern_length: Annotated[
        int | None,
        Meta(description="Longest regex in a client function's schema, in characters."),
    ] = 256
    """In ``pattern`` or as a ``patternProperties`` key. ``None`` disables the limit."""
    max_schema_check_steps: Annotated[
        int | None,
        Meta(description="Steps one check of a value against a client function's schema may take."),
    ] = 3_000
    """A step is a keyword evaluation (about 10 µs; ``enum`` counts its members,
    ``uniqueItems`` the pairs of items); a result or arguments past it fail as too large to
    check. ``None`` disables it."""
    max_cached_schemas: Annotated[
        int,
        Meta(description="Checked client-function schemas kept compiled for reuse; keep >= 256."),
    ] = 256
    """The least recently used go first. A declaration holds up to 256 schemas, and those
    that do not fit are checked on the event loop."""
    handshake_timeout: Annotated[
        float | None,
        Meta(description="Seconds a connection has to send its whole HTTP request (slowloris)."),
    ] = 10.0
    """Request line, headers and body, a WebSocket upgrade included, and the same for each
    request on a kept-alive connection. Past it the connection is dropped without an answer.
    ``None`` disables the limit."""
    keep_alive_timeout: Annotated[
        float,
        Meta(description="Seconds an idle HTTP keep-alive connection stays open."),
    ] = 5.0
    """uvicorn's ``timeout_keep_alive``."""
    max_connections: Annotated[
        int | None,
        Meta(description="Open connections past which new requests and upgrades get HTTP 503."),
    ] = 16_384
    """HTTP and WebSocket (uvicorn's ``limit_concurrency``). ``gateway serve`` raises its
    open-file limit to fit it when the system allows (and warns when it cannot). ``None``
    disables the limit."""
    send_timeout: Annotated[
        float | None,
        Meta(description="Seconds a send to a client that stopped reading may stall (then 1013)."),
    ] = 20.0
    """Then the socket is closed with 1013 and dropped after ``ws_close_timeout``; the
    session waits for a resume. ``None`` waits forever (the keepalive ping still notices a
    dead peer)."""
    ws_close_timeout: Annotated[
        float,
        Meta(description="Seconds a closing WebSocket waits for the client's close frame."),
    ] = 5.0
    """Then the connection is aborted, which frees what the kernel still buffers for a
    client that does not read."""
    max_sockets_per_ip: Annotated[
        int | None,
        Meta(description="Open WebSockets per client address; one more closes with 1013."),
    ] = 64
    """The addresses of ``forwarded_allow_ips`` (trusted proxies: this machine by default)
    are not limited: behind them each client's forwarded address is counted. ``None``
    disables the limit."""
    forwarded_allow_ips: Annotated[
        str,
        Meta(description="Proxies trusted to set X-Forwarded-For, comma-separated; * any."),
    ] = "127.0.0.1,::1"
    """Addresses or networks; an empty string trusts none. The forwarded address is the one
    ``max_sockets_per_ip`` counts."""
    max_sessions: Annotated[
        int | None,
        Meta(description="Sessions this node holds; one more session.start closes with 1013."),
    ] = 20_000
    """Live and waiting for a resume. Size it to the node's memory (docs/limits.md). ``None``
    disables the limit."""
    max_sessions_per_principal: Annotated[
        int | None,
        Meta(description="Sessions one caller holds; one more session.start closes with 4029."),
    ] = 100
    """The caller is a principal: an API key, or a user of a client token; sessions count
    live and waiting for a resume. Without auth (loopback only) every client is
    ``anonymous`` and only ``max_sessions`` holds. ``None`` disables the limit."""
    max_body_size: Annotated[
        int | None,
        Meta(description="Largest HTTP request body in bytes; a larger one gets HTTP 413."),
    ] = 64 * 2**10
    """The connection closes after the 413. ``None`` disables the limit."""
    max_history_chars: Annotated[
        int | None,
        Meta(description="Characters of history a session keeps and sends the model."),
    ] = 200_000
    """Characters of text plus bytes of JSON of tool arguments and outputs (instructions and
    tool schemas not counted). Before each model request the oldest whole turns go first; a
    tool call is never parted from its result and the turn in progress is never cut, so a
    turn that alone is over the budget is sent whole. ``None`` disables the limit (the
    history grows forever)."""
    max_tool_result_size: Annotated[
        int | None,
        Meta(description="Largest tool output or error, in bytes of JSON; larger fails the call."),
    ] = 256 * 2**10
    """A bigger client result is refused with ``error invalid_result`` and a bigger server
    tool output fails its call; either way the model gets a short tool error and nothing of
    the value is kept. ``None`` disables the limit."""


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
