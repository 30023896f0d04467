"""Client functions: plain Python functions the gateway's model can call on this device.

Their JSON Schema comes from the type hints (or is given explicitly); arguments
are converted to those types before the call, and the result to JSON.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

import msgspec

from client_sdk.handler import failure_text
from gateway.wire.v1 import ClientCall, ToolResult, ToolSpec, struct_schema

__all__ = ["ClientFunction", "answer", "make_function"]


@dataclass(frozen=True)
class ClientFunction:
    """A registered function and how it is declared to the gateway."""

    spec: ToolSpec
    func: Callable[..., Any]
    args_type: type[msgspec.Struct] | None
    """Converts the call's arguments; ``None`` passes them as they come."""

    async def invoke(self, args: dict[str, Any]) -> Any:
        """Run the function with the call's arguments; returns JSON-compatible data.

        A plain (non-async) function runs in a worker thread, so it cannot block the
        connection; such a thread cannot be interrupted when it overruns.
        """
        if self.args_type is not None:
            converted = msgspec.convert(args, self.args_type)
            kwargs = {f: getattr(converted, f) for f in self.args_type.__struct_fields__}
        else:
            kwargs = dict(args)
        if inspect.iscoroutinefunction(self.func):
            result = await self.func(**kwargs)
        else:
            result = await asyncio.to_thread(self.func, **kwargs)
        return msgspec.to_builtins(result)


async def answer(function: ClientFunction | None, call: ClientCall) -> ToolResult:
    """Run ``call`` with ``function`` (``None``: this client has none by that name) within
    the call's deadline; a failure or an overrun becomes the result's ``error``."""
    try:
        if function is None:
            raise LookupError(f"this client has no function {call.tool!r}")
        async with asyncio.timeout(max(0.0, call.timeout)):
            output = await function.invoke(call.args)
        return ToolResult(call_id=call.call_id, tool=call.tool, output=output)
    except TimeoutError:
        error = "the client function overran its deadline"
    except Exception as exc:  # the handler's failure is the model's to hear about
        error = failure_text(exc)
    return ToolResult(call_id=call.call_id, tool=call.tool, error=error)


def make_function(
    func: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
    output_schema: dict[str, Any] | None = None,
    timeout: float | None = None,
    display_name: str | None = None,
) -> ClientFunction:
    """Describe ``func`` as a client function (schemas from its type hints unless given)."""
    fn_name = name or func.__name__
    args_type = None if input_schema is not None else _args_type(fn_name, func)
    spec = ToolSpec(
        name=fn_name,
        description=(description or inspect.getdoc(func) or fn_name.replace("_", " ")).strip(),
        input_schema=(
            struct_schema(args_type)
            if args_type is not None
            else input_schema or {"type": "object", "properties": {}}
        ),
        output_schema=output_schema,
        display_name=display_name,
        timeout=timeout,
    )
    return ClientFunction(spec=spec, func=func, args_type=args_type)


def _args_type(name: str, func: Callable[..., Any]) -> type[msgspec.Struct]:
    hints = get_type_hints(func)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"client function {name!r}: *args and **kwargs have no schema")
        annotation = hints.get(param.name, Any)
        if param.default is inspect.Parameter.empty:
            fields.append((param.name, annotation))
        else:
            fields.append((param.name, annotation, param.default))
    return msgspec.defstruct(f"{name}_args", fields, kw_only=True, forbid_unknown_fields=True)
