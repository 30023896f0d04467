"""``gateway tools list`` and ``gateway tools test``: an agent's tools from a terminal.

``tools test`` runs exactly what ``POST /v1/tools/{name}/test`` runs (``run_tool_alone``),
with the same validation and errors, on the agent's backends started as the gateway starts
them (MCP servers connected, OpenAPI documents loaded).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from gateway.agent.file import DEMO_AGENT, Agent, load_agent
from gateway.agent.workbench import describe_tool, run_tool_alone
from gateway.config import from_env
from gateway.tools.toolbox import ToolRow

__all__ = ["add_tools_command", "run_tools_command"]


def add_tools_command(commands: Any) -> None:
    """Add ``tools list`` and ``tools test`` to the CLI's subcommands."""
    tools = commands.add_parser(
        "tools",
        help="list an agent's tools, or run one by itself",
        description="List an agent's tools, or run one server tool by itself, as the gateway"
        " would (its backends started, its input checked against its schema).",
    )
    actions = tools.add_subparsers(dest="action", required=True, title="actions", metavar="ACTION")
    listing = actions.add_parser(
        "list",
        help="list the tools: name, kind, backend, sync/async, input",
        description="List the agent's tools: name, kind, backend, sync/async and input.",
    )
    test = actions.add_parser(
        "test",
        help="run one server tool with an input, print its answer",
        description="Run one server tool with an input and print its answer; exit 1 if the"
        " tool failed, 2 if it could not run.",
    )
    test.add_argument("name", help="the tool's name, as `tools list` shows it")
    test.add_argument(
        "--input", default="{}", help="the tool's input, a JSON object (default: %(default)s)"
    )
    json_help = {
        listing: "print JSON instead of a table (default: off)",
        test: "print the answer as one line of JSON (default: off, indented)",
    }
    for parser in (listing, test):
        parser.add_argument(
            "--agent",
            type=Path,
            default=None,
            help="the agent file (default: GATEWAY_AGENT, else the demo agent)",
        )
        parser.add_argument("--json", action="store_true", help=json_help[parser])


async def run_tools_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run ``gateway tools ...``.

    Returns:
        The exit status: 0 done (for ``test``: the tool returned); 1 the tool ran and
        failed (an error, a timeout, an output off its schema); 2 it could not run (no
        such tool, a client function, input not JSON or off the schema).

    Raises:
        ConfigError: the agent file is invalid or a backend cannot start.
    """
    config = from_env(agent=str(args.agent)) if args.agent else from_env()
    agent = load_agent(Path(config.agent) if config.agent else DEMO_AGENT)

    async def listing() -> int:
        rows = agent.toolbox.rows()
        if args.json:
            out.write(
                json.dumps(
                    [
                        describe_tool(row) | {"input": _summary(row.definition.input_schema)}
                        for row in rows
                    ],
                    indent=2,
                )
                + "\n"
            )
        else:
            out.write(_table(rows))
        return 0

    async def test() -> int:
        status, answer = await run_tool_alone(
            agent, args.name, args.input.encode(), config.server_tool_timeout
        )
        out.write(json.dumps(answer, indent=None if args.json else 2) + "\n")
        if status != 200:
            return 2
        return 1 if "error" in answer else 0

    return await _with_started(agent, listing if args.action == "list" else test)


async def _with_started(agent: Agent, work: Callable[[], Awaitable[int]]) -> int:
    await agent.start()
    try:
        return await work()
    finally:
        await agent.aclose()


def _table(rows: list[ToolRow]) -> str:
    header = ("NAME", "KIND", "BACKEND", "RUNS", "INPUT")
    lines = [header] + [
        (
            row.definition.name,
            row.definition.kind,
            row.backend,
            row.definition.execution,
            _summary(row.definition.input_schema),
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        + "\n"
        for line in lines
    )


def _summary(schema: dict[str, Any]) -> str:
    """``order_id: string, limit?: integer``: each property, its type, ``?`` if optional."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    parts = []
    for name, prop in properties.items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        if isinstance(kind, list):
            kind = "|".join(str(k) for k in kind)
        parts.append(f"{name}{'' if name in required else '?'}: {kind}")
    return ", ".join(parts) or "(none)"
