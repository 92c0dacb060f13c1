"""The action chain: each message runs through the actions its group/topic config names.

Importing this package registers the built-in actions (``Json``, ``Transit``, ``Filter``, ``Order``,
``PullServer``, ``AsyncHttp``, ``Redis``).
"""

from ddmq.actions import async_http, filter_action, json_action, order, pull_server, redis_action, transit
from ddmq.actions.base import (
    Action,
    ChainContext,
    ServiceAction,
    Status,
    build_chain,
    close_chain,
    register,
    registered_names,
    start_chain,
)
from ddmq.actions.job import INVALID_JSON, NOT_PARSED, Job, JobState

__all__ = [
    "INVALID_JSON",
    "NOT_PARSED",
    "Action",
    "ChainContext",
    "Job",
    "JobState",
    "ServiceAction",
    "Status",
    "async_http",
    "build_chain",
    "close_chain",
    "filter_action",
    "json_action",
    "order",
    "pull_server",
    "redis_action",
    "register",
    "registered_names",
    "start_chain",
    "transit",
]
