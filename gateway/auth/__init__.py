"""Who gets in: API keys, client tokens, Origin and Host checks, admission counts."""

__all__: list[str] = []
