"""What every section shares: the strict base model, action names, order keys, start points."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict

#: Names an action chain may use; each is implemented in ``ddmq.actions``.
ACTION_NAMES: frozenset[str] = frozenset({"Json", "Transit", "Filter", "Order", "PullServer", "AsyncHttp", "Redis"})
#: Actions that end a chain by taking the message somewhere: exactly one, last.
SINK_ACTIONS: tuple[str, ...] = ("PullServer", "AsyncHttp", "Redis")

#: Order keys that are not JSONPaths.
ORDER_KEY_QID: Final = "QID"
ORDER_KEY_KEY: Final = "KEY"
ORDER_KEY_NONE: Final = "NONE"
#: Tenant expressions that are not JSONPaths: the message key, the message tag.
FAIR_KEY_KEY: Final = "KEY"
FAIR_KEY_TAG: Final = "TAG"


class Model(BaseModel):
    # strict: a boolean is never a number (YAML 1.1 reads `yes` as true) and "on" is no boolean.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class StartFrom(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"
