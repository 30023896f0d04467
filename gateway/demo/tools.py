"""Server tools of the demo agent."""

from __future__ import annotations

import asyncio
import os
import zlib
from typing import Annotated

import msgspec

from gateway.errors import ToolForbidden
from gateway.tools.python import Caller, Progress, tool

__all__ = [
    "Invoice",
    "OrderQuery",
    "OrderStatus",
    "StockLevel",
    "StockQuery",
    "check_order_status",
    "check_stock",
    "get_last_invoice",
]

_CATALOGUE = {
    "headphones": 129.0,
    "charger": 24.5,
    "phone case": 19.9,
    "smartwatch": 249.0,
    "earbuds": 89.0,
}


class StockQuery(msgspec.Struct, forbid_unknown_fields=True):
    product: Annotated[str, msgspec.Meta(description="Product name, e.g. 'headphones'.")]


class StockLevel(msgspec.Struct):
    product: str
    in_stock: bool
    quantity: int
    price: float | None


@tool(timeout=5)
def check_stock(query: StockQuery) -> StockLevel:
    """Check whether a product is in stock in the online shop, with its price."""
    name = query.product.strip().lower()
    # Deterministic pseudo-stock so the demo and the tests always agree.
    quantity = zlib.crc32(name.encode()) % 12 if name in _CATALOGUE else 0
    return StockLevel(
        product=name, in_stock=quantity > 0, quantity=quantity, price=_CATALOGUE.get(name)
    )


class OrderQuery(msgspec.Struct, forbid_unknown_fields=True):
    order_id: Annotated[str, msgspec.Meta(description="The order number, e.g. '1234'.")]


class OrderStatus(msgspec.Struct):
    order_id: str
    status: str
    eta: str


_STATUSES = (
    ("in the warehouse", "ships tomorrow"),
    ("on its way", "arrives in 2 days"),
    ("out for delivery", "arrives today"),
)


_OWNERS = {"5678": "ana", "9012": "ben"}
"""Orders placed by signed-in customers (user ids of client tokens); any other order
number is a guest order, which anyone may look up (the demo's "1234")."""


@tool(execution="async")
async def check_order_status(query: OrderQuery, progress: Progress, caller: Caller) -> OrderStatus:
    """Look up where an order is. Slow: the answer arrives later, while the chat goes on."""
    owner = _OWNERS.get(query.order_id)
    if owner is not None and caller.user_id != owner:
        # Refused at once, before any work: the model says so, the client sees "forbidden".
        raise ToolForbidden(f"order {query.order_id} belongs to another customer")
    # The lookup takes DEMO_ORDER_SECONDS (default 3 s), so the demo shows a pending call.
    seconds = float(os.environ.get("DEMO_ORDER_SECONDS", "3"))
    for stage in ("searching the warehouse", "asking the carrier"):
        progress({"stage": stage})
        await asyncio.sleep(seconds / 2)
    status, eta = _STATUSES[zlib.crc32(query.order_id.encode()) % len(_STATUSES)]
    return OrderStatus(order_id=query.order_id, status=status, eta=eta)


class Cancellation(msgspec.Struct):
    order_id: str
    cancelled: bool


@tool(timeout=5, confirm=True, confirm_prompt="Cancel order {order_id}?")
def cancel_order(query: OrderQuery, caller: Caller) -> Cancellation:
    """Cancel an order that has not shipped yet. The user is asked to confirm first."""
    owner = _OWNERS.get(query.order_id)
    if owner is not None and caller.user_id != owner:
        raise ToolForbidden(f"order {query.order_id} belongs to another customer")
    return Cancellation(order_id=query.order_id, cancelled=True)


class Invoice(msgspec.Struct):
    number: str
    amount: float
    status: str
    date: str


@tool(timeout=5, read_only=True)
def get_last_invoice() -> Invoice:
    """The user's last invoice: its number, amount, status and date (the billing agent's)."""
    return Invoice(number="INV-2041", amount=39.0, status="paid", date="2026-11-28")
