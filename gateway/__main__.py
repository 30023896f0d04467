"""Command line: ``gateway serve`` (flags mirror Config), ``gateway chat``, ``gateway schema``
and ``gateway tools list|test``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import structlog
import uvicorn

from gateway.agent.cli import add_tools_command, run_tools_command
from gateway.config import Config, from_env
from gateway.edge.app import create_app
from gateway.edge.server import fit_open_file_limit, protocols
from gateway.errors import ConfigError
from gateway.logging import configure_logging
from gateway.providers.failure import display_url
from gateway.providers.http import HttpProvider
from gateway.shell.runtime import Runtime
from gateway.wire.v1 import protocol_schema

__all__ = ["GatewayServer", "build_server", "main"]


def _flag_type(annotation: object) -> typing.Callable[[str], object]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if args else annotation
    if base in (int, float):
        return typing.cast(typing.Callable[[str], object], base)
    return str


def _description(annotation: object) -> str:
    """The ``Meta(description=...)`` of a Config field's annotation; ``""`` if it has none."""
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, msgspec.Meta) and meta.description:
            return meta.description
    return ""


def _help_phrase(sentence: str) -> str:
    """``"Seconds a ... cut."`` as argparse words it: ``"seconds a ... cut"`` (``TCP`` stays)."""
    sentence = sentence.rstrip(".")
    if len(sentence) > 1 and not sentence[1].isupper():
        sentence = sentence[0].lower() + sentence[1:]
    return sentence


def _shown(value: object) -> str:
    """A default as an operator would type it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return '""'
    return str(value)


def _add_config_flags(serve: argparse.ArgumentParser) -> None:
    """One flag per Config field: its description, default and variable (docs/limits.md)."""
    hints = typing.get_type_hints(Config)
    for field in msgspec.structs.fields(Config):
        flag = f"--{field.name.replace('_', '-')}"
        hint = hints[field.name]
        # An optional setting with a default is a limit that null turns off (STYLE.md).
        nullable = type(None) in typing.get_args(hint) and field.default is not None
        help_text = (
            f"{_help_phrase(_description(field.type))} (default: {_shown(field.default)};"
            f" env GATEWAY_{field.name.upper()}{', null disables' if nullable else ''})"
        ).replace("%", "%%")  # argparse formats help with %
        if hint is bool:  # a plain switch, such as --no-auth
            serve.add_argument(
                flag, dest=field.name, action="store_true", default=None, help=help_text
            )
            continue
        choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
        serve.add_argument(
            flag,
            dest=field.name,
            type=_flag_type(hint),
            default=None,
            # Shown, not enforced here: from_env's error names a bad value as for a variable.
            metavar="{" + ",".join(map(str, choices)) + "}" if choices else None,
            help=help_text,
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="Realtime conversation gateway: a WebSocket between your apps and a model.",
        epilog="Run 'gateway COMMAND --help' for a command's flags.",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, title="commands", metavar="COMMAND"
    )
    serve = commands.add_parser(
        "serve",
        help="run the gateway: the WebSocket endpoints, the web demo and the HTTP API",
        description="Run the gateway. Each setting is a flag and a GATEWAY_* environment"
        " variable; a flag wins over its variable. Flags take values only: a limit is turned"
        " off with null in its variable (GATEWAY_MAX_SESSIONS=null).",
    )
    _add_config_flags(serve)
    serve.add_argument(
        "--fd",
        type=int,
        default=None,
        # A supervisor or a test binds the port, so no two processes race for it.
        help="serve on this inherited listening socket (a file descriptor) instead of binding"
        " --host/--port (default: unset)",
    )
    chat = commands.add_parser(
        "chat",
        help="talk to a running gateway from this terminal",
        description="Talk to a running gateway from this terminal: its text as it streams, tool"
        " activity, and the demo agent's client functions run on this machine.",
    )
    chat.add_argument(
        "--url",
        default="ws://127.0.0.1:8000/v1/realtime",
        help="the gateway's WebSocket endpoint (default: %(default)s)",
    )
    chat.add_argument(
        "--token",
        default=None,
        help="a client token, if the gateway needs one (default: unset)",
    )
    schema = commands.add_parser(
        "schema",
        help="print the protocol's JSON Schema",
        description="Print the JSON Schema of every message of the protocol.",
    )
    schema.add_argument(
        "--output",
        type=Path,
        help="write the schema to this file instead of stdout (default: stdout)",
    )
    add_tools_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "chat":
        from client_sdk.chat import run_chat  # the SDK is needed only here

        return asyncio.run(run_chat(args.url, token=args.token))
    if args.command == "tools":
        try:
            configure_logging("warning")  # a backend's warnings, not the info lines
            return asyncio.run(run_tools_command(args))
        except ConfigError as exc:
            print(f"gateway: configuration error: {exc}", file=sys.stderr)
            return 2
    if args.command == "schema":
        text = json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n"
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "fd")}
    sock = None if args.fd is None else _inherited_socket(args.fd)
    if sock is not None:  # the socket's own address: the no-auth check must see it
        overrides["host"], overrides["port"] = sock.getsockname()[:2]
    try:
        config = from_env(**overrides)
        configure_logging(config.log_level)
        app = create_app(config)
    except ConfigError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    structlog.get_logger("gateway").info(
        "gateway_starting",
        host=config.host,
        port=config.port,
        **_serving(app.state.runtime, config),
    )
    fit_open_file_limit(config)
    server = build_server(config, app)
    _tune_gc()
    try:
        server.run(sockets=None if sock is None else [sock])
    except ConfigError as exc:  # a tool backend that cannot start (an MCP server, a document)
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    return 0


_GC_YOUNG_THRESHOLD = 10_000
"""Objects allocated (net of those freed) before the collector looks at the young ones;
Python's default is 700 (docs/performance.md, "Garbage collection")."""
_GC_MIDDLE_THRESHOLD = 2
"""Young collections before the middle generation is collected too; Python's default is
10. With the larger young generation, ten young collections' survivors made a middle
collection of 30-50 ms while a thousand sessions started their turns (gc.callbacks); two
keep each under about 12 ms, which a paced stream's beat absorbs."""
_GC_OLD_THRESHOLD = 50
"""Middle collections before a full one may run (Python's default: 10, and only once the
objects promoted since the last one are a quarter of the old ones). 50 times 2 keeps full
collections as rare as Python's 10 times 10 with the middle collected more often: each walks
every session's objects (half a second with 10,000 sessions), and at 10 they ran twice as
often while sessions opened."""


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the path of streaming sessions.

    At Python's default threshold an object that lives a few tens of ms (the timer of a
    paced model, a queued event) is collected young twice and promoted to the oldest
    generation, where it dies; those promotions trigger a full collection every second or
    two under load, which walks every object of every session: 120 ms stalls with 1,000
    sessions (measured with gc.callbacks). With a larger young generation they die young.
    """
    # What is loaded by now (modules, the agent, its schemas) lives as long as the process:
    # out of the collector's sight, a full collection walks only what sessions hold.
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, _GC_MIDDLE_THRESHOLD, _GC_OLD_THRESHOLD)


def _inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket a parent process handed over as file descriptor ``fd``.

    ``socket.socket(fileno=...)`` reads its family and protocol from the descriptor
    (uvicorn's own ``fd`` option takes it for a unix socket): asyncio then sets
    TCP_NODELAY on accepted sockets, and client addresses read right.
    """
    sock = socket.socket(fileno=fd)
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        raise SystemExit(f"gateway: --fd {fd} is not a TCP socket")
    return sock


def _serving(runtime: Runtime, config: Config) -> dict[str, str | None]:
    """What the gateway serves, for the startup line: agent, provider, model, base URL.

    Never the API key: only the settings that say which model answers.
    """
    provider = runtime.agent.provider
    http = provider.settings if isinstance(provider, HttpProvider) else None
    return {
        "agent": runtime.agent.name,
        "agent_file": config.agent or "demo",
        "provider": provider.name,
        "model": http.model if http else None,
        "base_url": display_url(http.base_url) if http else None,  # no key in a query
    }


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the gateway's graceful shutdown.

    On the first SIGTERM/SIGINT the gateway refuses new sockets, gives running
    responses ``shutdown_timeout`` seconds to finish, cuts the rest, closes every
    socket with 1012 ("service restart") and exits 0. A second signal exits at once.
    """

    def __init__(self, config: uvicorn.Config, runtime: Runtime, grace: float) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._grace = grace
        self._draining: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # Which loop ``--loop auto`` gave: uvloop where installed (measured faster, see
        # docs/performance.md), else asyncio's own.
        loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
        structlog.get_logger("gateway").info("event_loop_chosen", loop=loop)
        await self._runtime.start()  # the tool backends, before any socket is taken
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining is not None:
            super().handle_exit(sig, frame)  # second signal: stop now
            return
        loop = asyncio.get_event_loop()
        # A signal handler may interrupt the loop anywhere: schedule, do not act here.
        loop.call_soon_threadsafe(self._start_draining)

    def _start_draining(self) -> None:
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain(), name="gateway:drain")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        await self._runtime.aclose()  # the store's connections, the lease renewer

    async def _drain(self) -> None:
        try:
            await self._runtime.shutdown(self._grace)
        finally:
            self.should_exit = True


def build_server(config: Config, app: Any) -> GatewayServer:
    """The uvicorn server for ``app`` (from ``create_app``); port 0 picks a free port."""
    http, ws = protocols(config)  # the sans-I/O websockets one enforces ws_max_size (1009)
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=http,
        ws=ws,
        loop=config.loop,
        ws_max_size=config.ws_max_size,
        ws_ping_interval=config.ws_ping_interval,
        ws_ping_timeout=config.ws_ping_timeout,
        limit_concurrency=config.max_connections,
        proxy_headers=True,
        forwarded_allow_ips=config.forwarded_allow_ips,
        log_config=None,
        lifespan="off",
    )
    # uvicorn types it as int; it only ever hands it to loop.call_later.
    uvicorn_config.timeout_keep_alive = config.keep_alive_timeout  # type: ignore[assignment]
    return GatewayServer(
        uvicorn_config,
        runtime=app.state.runtime,
        grace=config.shutdown_timeout,
    )


if __name__ == "__main__":
    raise SystemExit(main())
