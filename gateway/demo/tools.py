"""Server tools of the demo agent."""

from __future__ import annotations

import zlib
from typing import Annotated

import msgspec

from gateway.tools import tool

__all__ = ["StockLevel", "StockQuery", "check_stock"]

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
