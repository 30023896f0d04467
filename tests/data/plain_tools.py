"""Server tools written with plain typed parameters, as in the OpenAI Agents SDK or FastMCP
(tests/test_tool_signatures.py), and their one-Struct twins."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway import Caller, Progress, tool


class Weather(msgspec.Struct):
    city: str
    temp: float
    unit: str


@tool
def get_weather(city: str, unit: Literal["c", "f"] = "c") -> Weather:
    """Tell the weather in a city.

    Args:
        city: The city, e.g. Paris.
        unit: Celsius or Fahrenheit.
    """
    return Weather(city=city, temp=21.0 if unit == "c" else 69.8, unit=unit)


class Address(msgspec.Struct, forbid_unknown_fields=True):
    street: str
    zip_code: str | None = None


class Shipment(msgspec.Struct):
    to: str
    items: list[str]
    sender: str


@tool(execution="async")
async def ship(
    address: Address,
    items: Annotated[list[str], msgspec.Meta(min_length=1, description="What to send.")],
    progress: Progress,
    caller: Caller,
) -> Shipment:
    """Ship items to an address."""
    for item in items:
        progress({"packed": item})
    return Shipment(to=address.street, items=items, sender=caller.principal)


class Pair(msgspec.Struct, forbid_unknown_fields=True):
    a: int
    b: Annotated[int, msgspec.Meta(ge=0)]


class Total(msgspec.Struct):
    total: int


@tool
def add_plain(a: int, b: Annotated[int, msgspec.Meta(ge=0)]) -> Total:
    """Add two integers (plain parameters)."""
    return Total(total=a + b)


@tool
def add_struct(pair: Pair) -> Total:
    """Add two integers (one Struct)."""
    return Total(total=pair.a + pair.b)
