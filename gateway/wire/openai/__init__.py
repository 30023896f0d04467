"""The OpenAI Realtime (GA) protocol as a codec of the core: its client events, the
frames the gateway writes, and the translation between them.
"""

__all__: list[str] = []
