"""Widget tools: client functions whose result comes from the user, not from code.

Part of the pure session core. A client function may carry a ``Widget`` (a choice list, a
yes/no confirmation, a short form); its calls go to the client with the widget filled in
from the call's arguments, the client shows it, and the user's answer is the result, checked
against the output schema made here when the tool declares none.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core.confirm import fill
from gateway.core.inbound import Widget

__all__ = ["answer_problem", "output_schema", "render", "widget_problem"]


def widget_problem(widget: Widget, input_schema: dict[str, Any]) -> str | None:
    """Why ``widget`` cannot work with a tool taking ``input_schema``, or ``None``."""
    if widget.type == "choice":
        if bool(widget.options) == (widget.options_arg is not None):
            return "a choice widget has either options or options_arg"
        if widget.options_arg is not None:
            prop = (input_schema.get("properties") or {}).get(widget.options_arg)
            if not isinstance(prop, dict) or prop.get("type") != "array":
                return f"options_arg {widget.options_arg!r} is not an array argument"
    elif widget.type == "form":
        if not widget.fields:
            return "a form widget has fields"
        names = [f.name for f in widget.fields]
        if len(set(names)) != len(names):
            return "a form widget's fields have different names"
    return None


def output_schema(widget: Widget) -> dict[str, Any]:
    """What the user's answer looks like (the result the model gets)."""
    if widget.type == "confirm":
        return {
            "type": "object",
            "properties": {"confirmed": {"type": "boolean"}},
            "required": ["confirmed"],
        }
    if widget.type == "choice":
        choice: dict[str, Any] = {"type": "string"}
        if widget.options:
            choice["enum"] = list(widget.options)
        return {"type": "object", "properties": {"choice": choice}, "required": ["choice"]}
    return {
        "type": "object",
        "properties": {
            f.name: {"type": "number" if f.type == "number" else "string"} for f in widget.fields
        },
        "required": [f.name for f in widget.fields if f.required],
    }


def answer_problem(shown: Widget, output: Any) -> str | None:
    """Why ``output`` is not an answer to the widget as it was shown (a choice that was not
    one of its options), or ``None``."""
    if shown.type == "choice" and isinstance(output, dict):
        if output.get("choice") not in shown.options:
            return "the choice is not one of the options shown"
    return None


def render(widget: Widget, args: dict[str, Any]) -> Widget | str:
    """``widget`` as a call with ``args`` shows it: the prompt filled in and the options
    taken from their argument; or why it cannot be shown."""
    options = list(widget.options)
    if widget.options_arg is not None:
        given = args.get(widget.options_arg)
        if (
            not isinstance(given, list)
            or not 0 < len(given) <= 20
            or not all(isinstance(o, str) and 0 < len(o) <= 100 for o in given)
        ):
            return f"{widget.options_arg} must be a list of 1 to 20 short strings to choose from"
        options = given
    return msgspec.structs.replace(
        widget, prompt=fill(widget.prompt, args)[:500], options=options, options_arg=None
    )
