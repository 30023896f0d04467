"""Confirmation rules, under the path they were first documented at: ``gateway.core.confirm``.

A plain re-export, kept so that code written against ``gateway.core.confirm`` keeps working.
"""

from gateway.core.confirm import *  # noqa: F403
from gateway.core.confirm import __all__ as __all__
