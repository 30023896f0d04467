"""The web demo page (index.html, demo.js, style.css), shipped as package data.

The gateway serves it at ``/`` and ``/demo/`` from the installed package
(``importlib.resources``), so the wheel carries it; there is no Python code here.
"""

__all__: list[str] = []
