"""The proxy's part of the error tree, and the codes they carry on the wire (``PullException.code``).

::

    DdmqError
    ├── RequestError              the client's request is wrong; fix the request
    │   ├── UnknownGroupError     1001
    │   ├── UnknownTopicError     1002
    │   ├── BadRequestError       1003
    │   │   ├── UnsupportedMediaTypeError  1003  HTTP body not sent as application/json (415)
    │   │   └── UnknownEntryError          1003  HTTP: no such dead letter (404)
    │   ├── NotSupportedError     1004
    │   ├── UnauthorizedError     1007  HTTP admin or data endpoint without the right bearer token
    │   └── ForbiddenError        1008  HTTP call refused: another site's page (Origin), a Host
    │                                   name not allowed, admin from another host without a token
    ├── UnavailableError          1005  shutting down or not ready; retry elsewhere/later
    ├── BrokerError               1006  Redis failed; retriable. The proxy's Redis client raises it for
    │                                   every failure (:mod:`ddmq.proxy.store.client`)
    └── ConfigError                     a config file is invalid (never on the wire)

Code 1500 on the wire means an unexpected internal error (logged with a traceback by the proxy). What
each code means and whether it is retriable is written once, in :data:`ddmq.protocol.errors.ERROR_CODES`;
``DdmqError`` lives there, with the whole tree (the producers' and the clients' errors too), and
``ConfigError`` in ``ddmq.config.errors`` (both importable from here).
"""

from __future__ import annotations

from ddmq.config.errors import ConfigError
from ddmq.protocol.errors import INTERNAL_ERROR_CODE, DdmqError

__all__ = [
    "INTERNAL_ERROR_CODE",
    "BadRequestError",
    "BrokerError",
    "ConfigError",
    "DdmqError",
    "ForbiddenError",
    "NotSupportedError",
    "RequestError",
    "UnauthorizedError",
    "UnavailableError",
    "UnknownEntryError",
    "UnknownGroupError",
    "UnknownTopicError",
]


class RequestError(DdmqError):
    code = 1003


class UnknownGroupError(RequestError):
    code = 1001


class UnknownTopicError(RequestError):
    code = 1002


class BadRequestError(RequestError):
    code = 1003


class UnsupportedMediaTypeError(BadRequestError):
    """A body in another format than JSON; HTTP answers 415 (a browser page of another site can send
    only form and text bodies without asking first)."""


class UnknownEntryError(BadRequestError):
    """An admin call names an entry (a dead letter) that is not there; HTTP answers 404."""


class NotSupportedError(RequestError):
    code = 1004


class UnauthorizedError(RequestError):
    code = 1007


class ForbiddenError(RequestError):
    code = 1008


class UnavailableError(DdmqError):
    code = 1005


class BrokerError(DdmqError):
    code = 1006

