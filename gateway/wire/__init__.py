"""Wire protocols: pure codecs over the core's vocabulary (v1, our own; ``openai``, the
OpenAI-Realtime-compatible one).
"""

__all__: list[str] = []
