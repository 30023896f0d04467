"""Speech-to-speech models behind the gateway: OpenAI Realtime and Gemini Live.

A ``RealtimeProvider`` is a node's: what an agent's ``[model]`` names (``provider =
"openai-realtime"`` or ``"gemini-live"``), its voices, and a factory of ``Upstream``
sessions (``gateway.providers.realtime.upstream``), one per conversation, which the
session's voice link (``gateway.shell.realtime_voice``) opens and drives. The model hears
the user and speaks; the gateway keeps the tools, the history and the client's events.

It is a ``Provider`` too, so an agent can name it, but a model step streams only through the
session's link (``stream`` here refuses): the driver hands its steps there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from gateway.core.model import ModelEvent, ModelRequest
from gateway.errors import ProviderError
from gateway.providers.base import Capabilities
from gateway.providers.realtime.upstream import Upstream

__all__ = [
    "GEMINI_VOICES",
    "OPENAI_SESSION_S",
    "OPENAI_VOICES",
    "REALTIME_PROVIDERS",
    "RealtimeProvider",
]

OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)
GEMINI_VOICES = ("Puck", "Charon", "Kore", "Fenrir", "Aoede", "Leda", "Orus", "Zephyr")
REALTIME_PROVIDERS = ("openai-realtime", "gemini-live")
OPENAI_SESSION_S = 3300.0
"""OpenAI ends a realtime session at 60 minutes: the conversation moves on at 55."""


class RealtimeProvider:
    """A speech-to-speech model; see the module docstring.

    Args:
        name: ``openai-realtime`` or ``gemini-live``.
        upstream: opens a new upstream session (not connected yet: ``Upstream.open``).
        voices: the model's voices, its default first.
        max_session_s: the upstream's own cap on a session (OpenAI: 60 minutes), or
            ``None``; the link moves the conversation to a new session before it.
    """

    capabilities = Capabilities(tools=True, parallel_tool_calls=True, tool_choice=False)

    def __init__(
        self,
        name: str,
        upstream: Callable[[], Upstream],
        *,
        voices: tuple[str, ...],
        max_session_s: float | None = None,
    ) -> None:
        self.name = name
        self.new_upstream = upstream
        self.voices = voices
        self.max_session_s = max_session_s

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        raise ProviderError(f"{self.name}: a speech-to-speech model streams through its session")

    async def aclose(self) -> None:
        """Nothing pooled: each session closes its own upstream."""
