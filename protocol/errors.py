"""The error codes a proxy answers with, on both protocols: what each means and whether calling again
can help.

Thrift carries the code in ``PullException.code``, HTTP in the error body's ``code`` (with this table's
``retriable`` next to it). The proxy's exceptions take their code's retriability from here and the
clients decide from here whether to retry, so the two sides cannot disagree about a code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ERROR_CODES",
    "INTERNAL_ERROR_CODE",
    "DdmqError",
    "ErrorCode",
    "is_retriable",
]


@dataclass(frozen=True)
class ErrorCode:
    code: int
    meaning: str
    #: whether the same call, made again after a pause (or to another proxy), can succeed
    retriable: bool


INTERNAL_ERROR_CODE: Final = 1500

ERROR_CODES: Final[dict[int, ErrorCode]] = {
    entry.code: entry
    for entry in (
        ErrorCode(1001, "unknown group", retriable=False),
        ErrorCode(1002, "unknown topic", retriable=False),
        ErrorCode(1003, "bad request", retriable=False),
        ErrorCode(1004, "not supported", retriable=False),
        ErrorCode(1005, "unavailable: shutting down or not ready", retriable=True),
        ErrorCode(1006, "broker (Redis) error", retriable=True),
        ErrorCode(1007, "unauthorized: no or a wrong bearer token", retriable=False),
        ErrorCode(1008, "forbidden: another site's page, a Host not allowed, or admin from afar", retriable=False),
        # An unexpected error inside the proxy (it logs the traceback): a pause and a retry may pass it.
        ErrorCode(INTERNAL_ERROR_CODE, "internal error", retriable=True),
    )
}


def is_retriable(code: int) -> bool:
    """Whether calling again can help; a code this version does not know is taken as worth a retry."""
    entry = ERROR_CODES.get(code)
    return True if entry is None else entry.retriable


class DdmqError(Exception):
    """Base of every error the proxy side raises; ``code`` is what it answers with on the wire.

    ``retriable`` follows the code (:data:`ERROR_CODES`), in every subclass too.
    """

    code: int = INTERNAL_ERROR_CODE
    retriable: bool = is_retriable(INTERNAL_ERROR_CODE)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.retriable = is_retriable(cls.code)
