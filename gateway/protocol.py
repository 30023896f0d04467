"""Wire protocol v1, under the path it was first documented at: ``gateway.wire.v1``.

A plain re-export, kept so that code written against ``gateway.wire.v1`` keeps working.
"""

from gateway.wire.v1 import *  # noqa: F403
from gateway.wire.v1 import __all__ as __all__
