"""The session core: pure, events in and effects out; no asyncio, no clock, no I/O.

Imports only the stdlib, msgspec and ``gateway.errors`` (``tests/test_layering.py``).
"""

__all__: list[str] = []
