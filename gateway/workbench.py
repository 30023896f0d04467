"""Run one server tool by itself, outside any conversation: for agent builders who test a
tool before an agent uses it (``POST /v1/tools/{name}/test``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from gateway.agent import Agent

__all__ = ["describe_agent", "describe_tools", "run_tool_alone"]


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
    """The agent's tools with their schemas (``GET /v1/tools``)."""
    return {
        "agent": agent.name,
        "tools": [
            {
                "name": d.name,
                "kind": d.kind,
                "execution": d.execution,
                "delivery": d.delivery if d.execution == "async" else None,
                "display_name": d.display_name,
                "description": d.description,
                "input_schema": d.input_schema,
                "output_schema": d.output_schema,
                "timeout": d.timeout,
            }
            for d in agent.tools.definitions()
        ],
    }


async def run_tool_alone(
    agent: Agent, name: str, body: bytes, default_timeout: float
) -> tuple[int, dict[str, Any]]:
    """Validate ``body`` against the tool's input schema, run the tool, time it.

    Returns:
        The HTTP status and the JSON answer: ``{output, duration_ms}`` or
        ``{error, duration_ms}`` when the tool ran; ``{error}`` when it could not.
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
    tool = agent.server_tools[name]
    timeout = entry.definition.timeout or default_timeout
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            output = await tool.invoke(args)
    except TimeoutError:
        return 200, {"error": f"tool_timeout: no result within {timeout} s", **_since(started)}
    except Exception as exc:  # the tool's failure is the answer, as a model would see it
        return 200, {"error": f"{type(exc).__name__}: {exc}", **_since(started)}
    if entry.output_validator is not None and (problem := entry.output_validator.problem(output)):
        return 200, {
            "error": f"result does not match the output schema: {problem}",
            **_since(started),
        }
    return 200, {"output": output, **_since(started)}


def _since(started: float) -> dict[str, float]:
    return {"duration_ms": round((time.perf_counter() - started) * 1000, 1)}
