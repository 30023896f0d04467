"""Server tools written in Python, under the path they were first documented at:
``gateway.core.tool.python`` (and ``from gateway import tool``, the tool author's import).

A plain re-export, kept so that code written against ``gateway.tools.python`` keeps working.
"""

from gateway.tools.python import *  # noqa: F403
from gateway.tools.python import __all__ as __all__
