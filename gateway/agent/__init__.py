"""Agents: the agent file's format (``spec``), agent files loaded (instructions, model, tools)
and the crew they hand over to (``file``), running one tool alone (``workbench``) and
``gateway tools`` (``cli``).

``from gateway.agent import load_agent`` is the path agents were first documented at.
"""

from gateway.agent.file import *  # noqa: F403
from gateway.agent.file import __all__ as __all__
