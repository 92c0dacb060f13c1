"""The action chain: each message runs through the actions its group/topic config names.

Importing this package registers the built-in actions (``Json``, ``Order``, ``PullServer``).
"""

from ddmq.actions import json_action, order, pull_server
from ddmq.actions.base import Action, ChainContext, Status, build_chain, register, registered_names

__all__ = [
    "Action",
    "ChainContext",
    "Status",
    "build_chain",
    "json_action",
    "order",
    "pull_server",
    "register",
    "registered_names",
]
