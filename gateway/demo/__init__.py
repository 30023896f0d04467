"""The bundled demo agent: a shop assistant on the scripted model."""

__all__: list[str] = []
