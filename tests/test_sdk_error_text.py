"""What the gateway hears when an app's handler fails: ``"<ClassName>: <message>"``, but the
message alone for a bare ``Exception``, whose name says nothing to the model or the user
(``failure_text``, used by client functions, server-tool, widget and confirmation handlers,
and the terminal chat). The JS SDK's ``describe`` follows the same rule (its own tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from client_sdk import connect
from client_sdk.chat import _describe_failure
from client_sdk.confirm import ask
from client_sdk.functions import answer, make_function
from client_sdk.handler import failure_text
from client_sdk.server_tools import decide
from client_sdk.widgets import ask_user
from gateway.wire.v1 import ClientCall, ConfirmItem, ToolResult, Widget
from tests.data.tools import reset_gates
from tests.support import Gateway, serving


class Unnamed(Exception):
    """A subclass of ``Exception``: its own name, which it keeps."""


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (
            Exception("The user has turned off battery access."),
            "The user has turned off battery access.",
        ),
        (ValueError("no such zip code"), "ValueError: no such zip code"),
        (LookupError("no such order"), "LookupError: no such order"),
        (Unnamed("from a subclass"), "Unnamed: from a subclass"),
        (Exception(), "Exception"),
        (ValueError(), "ValueError"),
        (Exception("two", "args"), "('two', 'args')"),
    ],
)
def test_failure_text_drops_only_a_bare_exceptions_name(exc: Exception, text: str) -> None:
    assert failure_text(exc) == text


def call_of(tool: str, widget: Widget | None = None) -> ClientCall:
    return ClientCall(
        call_id=f"call_{tool}",
        tool=tool,
        display_name=tool,
        args={},
        deadline=0.0,
        timeout=5.0,
        widget=widget,
    )


def raising(exc: Exception) -> Callable[..., Any]:
    def handler(*_: object) -> Any:
        raise exc

    return handler


async def test_every_handler_sends_the_same_text() -> None:
    plain, named = Exception("the screen is off"), RuntimeError("the screen is off")
    for exc, text in [(plain, "the screen is off"), (named, "RuntimeError: the screen is off")]:
        function = make_function(raising(exc), name="get_battery_level", input_schema={})
        results = [
            await answer(function, call_of("get_battery_level")),
            await decide(raising(exc), call_of("check_stock")),
            await ask_user(raising(exc), call_of("pick", Widget(type="confirm", prompt="Sure?"))),
        ]
        assert [r.error for r in results if isinstance(r, ToolResult)] == [text] * 3
        item = ConfirmItem(
            call_id="call_c",
            tool="cancel_order",
            display_name="Cancel order",
            args={},
            prompt="Cancel order 1234?",
            deadline=0.0,
            timeout=5.0,
        )
        declined = await ask(raising(exc), item)
        assert declined.reason == f"the confirmation handler failed ({text})"
    context: dict[str, Any] = {"message": "Task exception was never retrieved", "exception": plain}
    assert _describe_failure(context) == "the screen is off"


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    reset_gates()
    async with serving() as running:
        yield running


async def test_the_model_hears_a_bare_exceptions_message_alone(gateway: Gateway) -> None:
    async with connect(gateway.url) as conv:

        @conv.client_function("device_a")
        async def device_a() -> dict[str, str]:
            raise Exception("The user has turned off battery access.")

        text = "".join([d async for d in conv.say("one")])
    assert text == "calling A A failed: The user has turned off battery access."
