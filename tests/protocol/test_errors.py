"""The one error-code table: the proxy's exceptions and the SDK's errors read their retriability from it."""

from __future__ import annotations

import pytest

from ddmq.client.thrift_client import FATAL_CODES, PullError, RemoteApplicationError
from ddmq.config.errors import ConfigError
from ddmq.protocol.errors import ERROR_CODES, INTERNAL_ERROR_CODE, DdmqError, is_retriable
from ddmq.proxy.core import errors as proxy_errors

WIRE_ERRORS = [
    proxy_errors.UnknownGroupError, proxy_errors.UnknownTopicError, proxy_errors.BadRequestError,
    proxy_errors.UnsupportedMediaTypeError, proxy_errors.UnknownEntryError, proxy_errors.NotSupportedError,
    proxy_errors.UnauthorizedError, proxy_errors.ForbiddenError, proxy_errors.UnavailableError,
    proxy_errors.BrokerError, DdmqError,
]


@pytest.mark.parametrize("cls", WIRE_ERRORS, ids=lambda cls: cls.__name__)
def test_every_proxy_error_carries_a_known_code_and_its_retriability(cls: type[DdmqError]) -> None:
    assert cls.code in ERROR_CODES
    assert cls.retriable is ERROR_CODES[cls.code].retriable
    assert cls("x").retriable is ERROR_CODES[cls.code].retriable


def test_only_unavailable_broker_and_internal_errors_are_worth_a_retry() -> None:
    assert {code for code, entry in ERROR_CODES.items() if entry.retriable} == {1005, 1006, INTERNAL_ERROR_CODE}
    assert FATAL_CODES == {1001, 1002, 1003, 1004, 1007, 1008}


@pytest.mark.parametrize("code", [*ERROR_CODES, 1999])
def test_the_client_reads_the_same_table(code: int) -> None:
    assert PullError(code, "m").retriable is is_retriable(code)
    assert RemoteApplicationError(6, f"{code}: m").retriable is is_retriable(code)


def test_an_unknown_code_is_taken_as_retriable_and_the_config_error_is_a_ddmq_error() -> None:
    assert is_retriable(1999)
    assert issubclass(ConfigError, DdmqError) and proxy_errors.ConfigError is ConfigError
