"""Which tools the model may call in a response: ``tool_choice``, per-message ``tools`` and
``max_steps``, checked when a client asks for them and applied to each model step.

Part of the pure session core: no I/O. ``tool_choice`` is ``auto`` (the model's choice),
``none`` (no tool), ``required`` (at least one call) or one tool's name. A forced choice
(``required`` or a name) holds for the first step of a response only: the steps after it,
which see the calls' results, are ``auto``, or the model would be made to call tools until
``max_steps`` ran out (the loop agent SDKs guard against the same way).
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = [
    "choice_problem",
    "narrowing_problem",
    "refusal",
    "step_choice",
    "steps_problem",
]


def choice_problem(
    choice: str | None,
    offered: Collection[str],
    *,
    supports_tools: bool,
    supports_choice: bool,
) -> str | None:
    """Why ``choice`` cannot be honoured for a response offered the tools ``offered``, or
    ``None`` when it can. ``auto`` always can, and so can ``none``: a model that cannot be
    told still has its calls refused (``refusal``)."""
    if choice in (None, "auto", "none"):
        return None
    if not supports_tools:
        return f"tool_choice {choice!r}: this agent's model cannot call tools"
    if not supports_choice:
        return f"tool_choice {choice!r}: this agent's model does not take a tool_choice"
    if choice == "required":
        return "tool_choice 'required': no tool is offered" if not offered else None
    if choice not in offered:
        return (
            f"tool_choice {choice[:64]!r} is neither auto, none, required nor one of the"
            f" tools offered ({', '.join(sorted(offered)) or 'none'})"
        )
    return None


def narrowing_problem(names: list[str] | None, session_tools: Collection[str]) -> str | None:
    """Why a message's ``tools`` is not a subset of the session's tools, or ``None``."""
    if names is None:
        return None
    unknown = sorted({name for name in names if name not in session_tools})
    if unknown:
        shown = ", ".join(repr(name[:64]) for name in unknown[:5])
        return f"tools names what the session does not offer: {shown}"
    return None


def steps_problem(max_steps: int | None, limit: int) -> str | None:
    """Why ``max_steps`` is over the gateway's ``limit``, or ``None``."""
    if max_steps is not None and max_steps > limit:
        return f"max_steps {max_steps} is over this gateway's limit ({limit})"
    return None


def step_choice(choice: str, *, first_step: bool, offered: Collection[str]) -> str:
    """The ``tool_choice`` of one model step of a response whose choice is ``choice``."""
    if choice in ("auto", "none"):
        return choice
    if not first_step:
        return "auto"
    if choice != "required" and choice not in offered:
        return "auto"  # the tool went away (a session.update) while the message waited
    return choice


def refusal(tool: str, choice: str, allowed: Collection[str] | None) -> str | None:
    """Why a call of ``tool`` the model asked for is refused in a response whose choice is
    ``choice`` and whose message narrowed its tools to ``allowed``; ``None`` to run it."""
    if choice == "none":
        return f"tool {tool[:64]!r} was not called: tools are off for this response"
    if allowed is not None and tool not in allowed:
        return f"tool {tool[:64]!r} is not offered for this response"
    return None
