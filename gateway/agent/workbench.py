"""Run one server tool by itself, outside any conversation: for agent builders who test a
tool before an agent uses it (``POST /v1/tools/{name}/test``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from gateway.agent.file import Agent
from gateway.tools.base import failure_code, tool_failure
from gateway.tools.python import Progress
from gateway.tools.toolbox import ToolRow

__all__ = ["describe_agent", "describe_tool", "describe_tools", "run_tool_alone"]


def describe_agent(agent: Agent) -> dict[str, Any]:
    """What a chat page shows about the agent (``GET /v1/agent``): its name, the provider
    and model behind it, and the example prompts its file declares. No URL, no key."""
    return {
        "agent": agent.name,
        "provider": agent.provider.name,
        "model": agent.model,
        "suggestions": list(agent.suggestions),
    }


def describe_tools(agent: Agent) -> dict[str, Any]:
    """The agent's tools with their schemas and the backend each runs in (``GET /v1/tools``)."""
    return {"agent": agent.name, "tools": [describe_tool(row) for row in agent.toolbox.rows()]}


def describe_tool(row: ToolRow) -> dict[str, Any]:
    """One tool as ``GET /v1/tools`` (and ``gateway tools list --json``) shows it."""
    d = row.definition
    return {
        "name": d.name,
        "kind": d.kind,
        "backend": row.backend,
        "execution": d.execution,
        "delivery": d.delivery if d.execution == "async" else None,
        "display_name": d.display_name,
        "description": d.description,
        "input_schema": d.input_schema,
        "output_schema": d.output_schema,
        "timeout": d.timeout,
        "read_only": d.read_only,
        "scopes": list(d.scopes),
        "confirm": d.confirm,
    }


async def run_tool_alone(
    agent: Agent, name: str, body: bytes, default_timeout: float
) -> tuple[int, dict[str, Any]]:
    """Validate ``body`` against the tool's input schema, run the tool, time it: what
    ``POST /v1/tools/{name}/test`` and ``gateway tools test`` both run.

    Returns:
        The HTTP status and the JSON answer: ``{output, duration_ms}`` or
        ``{error, duration_ms}`` when the tool ran, with ``progress`` (the payloads it
        reported, in order) when it reported any; ``{error}`` when it could not run.
    """
    entry = agent.tools.get(name)
    if entry is None:
        return 404, {"error": f"no tool {name!r} in agent {agent.name!r}"}
    if entry.definition.kind == "client":
        return 400, {
            "error": f"{name} is a client function: it runs in the client, not on the gateway"
        }
    try:
        args = msgspec.json.decode(body or b"{}")
    except msgspec.DecodeError as exc:
        return 400, {"error": f"the body is not JSON: {exc}"}
    problem = entry.input_validator.problem(args)
    if problem:
        return 422, {"error": f"invalid input: {problem}"}
    timeout = entry.definition.timeout or default_timeout
    reports: list[Any] = []
    started = time.perf_counter()

    def ran(answer: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answer["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
        if reports:
            answer["progress"] = reports
        return 200, answer

    try:
        async with asyncio.timeout(timeout):
            output = await agent.toolbox.call(name, args, Progress(reports.append))
    except TimeoutError:
        return ran({"error": f"tool_timeout: no result within {timeout} s"})
    except Exception as exc:  # the tool's failure is the answer, as a model would see it
        failed = {"error": tool_failure(exc)}
        if (code := failure_code(exc)) is not None:
            failed["code"] = code
        return ran(failed)
    if entry.output_validator is not None and (problem := entry.output_validator.problem(output)):
        return ran({"error": f"result does not match the output schema: {problem}"})
    return ran({"output": output})
