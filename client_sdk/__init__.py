"""Client SDK for the conversation gateway (Python; the browser module is in ``js/``)."""

from client_sdk.connection import Connection, connect_raw

__all__ = ["Connection", "connect_raw"]
