"""Client SDK for the conversation gateway (Python; the browser module is in ``js/``).

``connect`` gives a ``Conversation``: client functions, streamed replies, and a
socket that survives drops. ``connect_raw`` is the typed low-level connection.
"""

from client_sdk.client import Conversation, connect
from client_sdk.connection import Connection, connect_raw
from client_sdk.events import EventStream
from client_sdk.exceptions import ClientError, ResumeGap, ServerError, SessionClosed

__all__ = [
    "ClientError",
    "Connection",
    "Conversation",
    "EventStream",
    "ResumeGap",
    "ServerError",
    "SessionClosed",
    "connect",
    "connect_raw",
]
