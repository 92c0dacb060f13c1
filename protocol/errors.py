"""The error codes a proxy answers with, on both protocols, and the root of every error the project raises.

Thrift carries the code in ``PullException.code``, HTTP in the error body's ``code`` (with this table's
``retriable`` next to it). The proxy's exceptions take their code's retriability from here and the
clients decide from here whether to retry, so the two sides cannot disagree about a code.

Every error the project raises on purpose is a :class:`DdmqError`: ``except DdmqError`` catches them
all, and ``retriable`` says whether the same call, made again after a pause (or to another proxy), can
succeed. ``code`` is what the proxy answers with on the wire; an error of a class that never crosses it
keeps the internal error's code. Where callers catch a builtin kind, the error is that kind too (a
``ValueError``, a ``ConnectionError``). The tree, by the module that defines each part::

    DdmqError                         1500  retriable   an unexpected error (protocol/errors.py)
    ├── RequestError                  1003  no          the request is wrong (proxy/core/errors.py)
    │   ├── UnknownGroupError         1001  no
    │   ├── UnknownTopicError         1002  no
    │   ├── BadRequestError           1003  no          (and its HTTP kinds: 415, 404, a body too slow)
    │   ├── NotSupportedError         1004  no
    │   ├── UnauthorizedError         1007  no
    │   └── ForbiddenError            1008  no
    ├── UnavailableError              1005  retriable   shutting down, not ready, a port not bound
    ├── BrokerError                   1006  retriable   Redis failed, as the proxy's Redis client
    │   │                                               raises it (proxy/store/client.py)
    │   └── ScriptNotCachedError      1006  retriable   EVALSHA of a script the server lacks; also
    │                                                   redis-py's NoScriptError (its EVAL fallback)
    ├── EmbeddedRedisError                  no          the embedded redis-server (proxy/store/embedded.py)
    ├── ConfigError                         no          a config file is invalid (config/errors.py)
    ├── ExpressionError                     no          also a ValueError: an expression's text (a Filter,
    │                                                   a Redis command's ``when``; config/expression.py)
    ├── ProduceError                        retriable   a producer's Redis failed (protocol/redis/queues.py);
    │   │                                               not retriable when Redis holds data it cannot use
    │   ├── TopicMismatchError              no          a topic with another number of queues
    │   └── DeliveryError                   per send    a send gave up (protocol/produce/delivery.py):
    │       │                                           retriable when what it gave up on was
    │       └── RedisFullError              retriable   Redis stayed full until the deadline
    ├── MessageTooLargeError                no          also a ValueError (protocol/produce/delivery.py)
    ├── ProxyClientError                    retriable   a proxy client's call failed (client/thrift_client.py)
    │   ├── PullError                 its code          the proxy answered with a PullException
    │   ├── ProxyConnectionError            retriable   also a ConnectionError: the transport failed
    │   ├── ProxyProtocolError              retriable   a reply that made no sense
    │   │   └── WrongPortError              no          an HTTP server answered
    │   └── RemoteApplicationError    its code          a TApplicationException (retriable without a
    │                                                   code when it was an internal error)
    ├── CliError                            no          a ``ddmq`` command failed (protocol/clitools.py)
    ├── GroupHeld                           retriable   ``ddmq groups delete`` of a group being consumed
    │                                                   (client/cli/group_registry.py)
    ├── ProxyProcessError                   no          also a RuntimeError: a proxy child exited or did
    │                                                   not listen (client/cli/proxy_process.py)
    └── DataLossError                       no          also a RuntimeError: the Spark source found offsets
                                                        trimmed (client/spark/queue_mode.py)

A subclass that sets ``code`` takes ``retriable`` from :data:`ERROR_CODES` unless it sets its own; one
that sets neither keeps its parent's; errors whose retriability depends on the case set it per instance.
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
    """Base of every error the project raises (the tree is in this module's docstring); ``code`` is
    what the proxy answers with on the wire, ``retriable`` whether calling again can help."""

    code: int = INTERNAL_ERROR_CODE
    retriable: bool = is_retriable(INTERNAL_ERROR_CODE)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__ and "retriable" not in cls.__dict__:
            cls.retriable = is_retriable(cls.code)
