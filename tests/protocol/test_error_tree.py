"""One error tree (protocol/errors.py): every public error class of the product is a DdmqError with the
retriability its docstring gives, keeps the builtin kind callers catch, and stays importable where it was."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from ddmq.client.cli.group_registry import GroupHeld
from ddmq.client.cli.proxy_process import ProxyProcessError
from ddmq.client.spark.queue_mode import DataLossError
from ddmq.client.thrift_client import (
    ProxyClientError,
    ProxyConnectionError,
    ProxyProtocolError,
    PullError,
    RemoteApplicationError,
    WrongPortError,
)
from ddmq.config.errors import ConfigError
from ddmq.config.expression import ExpressionError
from ddmq.protocol.clitools import CliError
from ddmq.protocol.errors import DdmqError
from ddmq.protocol.produce.delivery import DeliveryError, MessageTooLargeError, RedisFullError
from ddmq.protocol.redis.queues import ProduceError, TopicMismatchError, parse_queues
from ddmq.proxy.core import errors as proxy_errors
from ddmq.proxy.servers.http.connections import BodyTimeoutError
from ddmq.proxy.store.client import ScriptNotCachedError
from ddmq.proxy.store.embedded import EmbeddedRedisError

ROOT = Path(__file__).resolve().parents[2]

#: Every public error class and whether calling again can help (the class's own; some set it per case).
RETRIABLE: dict[type[BaseException], bool] = {
    DdmqError: True,
    proxy_errors.RequestError: False,
    proxy_errors.UnknownGroupError: False,
    proxy_errors.UnknownTopicError: False,
    proxy_errors.BadRequestError: False,
    proxy_errors.UnsupportedMediaTypeError: False,
    proxy_errors.UnknownEntryError: False,
    proxy_errors.NotSupportedError: False,
    proxy_errors.UnauthorizedError: False,
    proxy_errors.ForbiddenError: False,
    BodyTimeoutError: False,
    proxy_errors.UnavailableError: True,
    proxy_errors.BrokerError: True,
    ScriptNotCachedError: True,
    EmbeddedRedisError: False,
    ConfigError: False,
    ExpressionError: False,
    ProduceError: True,
    TopicMismatchError: False,
    DeliveryError: True,
    RedisFullError: True,
    MessageTooLargeError: False,
    ProxyClientError: True,
    PullError: True,
    ProxyConnectionError: True,
    ProxyProtocolError: True,
    WrongPortError: False,
    RemoteApplicationError: True,
    CliError: False,
    GroupHeld: True,
    ProxyProcessError: False,
    DataLossError: False,
}

#: Public exception classes that are not errors of the tree, and why.
NOT_IN_THE_TREE: dict[str, str] = {
    # signals a caller acts on, never reported as errors
    "ddmq.client.handling.Retry": "a handler asks for its message again",
    "ddmq.client.pull_parts.NotProcessed": "a handler leaves its message for a later pull",
    "ddmq.proxy.store.broker.ForeignEntry": "the reader dead-letters the entry and reads on",
    # the wire codec's findings, which never reach a caller as they are: the server answers 1003 or closes
    # the connection, the clients raise ProxyProtocolError
    "ddmq.protocol.wire.reader.FrameDecodeError": "the codec's: a frame that cannot be read",
    "ddmq.protocol.wire.frames.FrameRefusedError": "the codec's: a call refused while decoded",
    "ddmq.protocol.wire.frames.FrameTooLargeError": "the codec's: too many offsets",
    "ddmq.protocol.wire.frames.FieldRangeError": "the codec's: an integer outside its IDL type",
    "ddmq.protocol.wire.layout.VarintTooLongError": "the codec's: a varint past its bytes",
    "ddmq.proxy.servers.thrift.errors.ChannelClosedError": "the peer closed mid-frame; the server stops reading",
}


def _public_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for folder in ("protocol", "config", "actions", "proxy", "client"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            name = "ddmq." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name
                        and not attr.startswith("_")):
                    found[f"{name}.{attr}"] = value
    return found


def test_every_public_error_class_is_in_the_tree() -> None:
    found = _public_exceptions()
    outside = sorted(
        name for name, cls in found.items() if not issubclass(cls, DdmqError) and name not in NOT_IN_THE_TREE
    )
    assert outside == [], "public error classes outside the DdmqError tree"
    assert sorted(set(NOT_IN_THE_TREE) - set(found)) == []  # an entry that is gone must go
    assert {cls for cls in found.values() if issubclass(cls, DdmqError)} == set(RETRIABLE)


@pytest.mark.parametrize("cls", list(RETRIABLE), ids=lambda cls: cls.__name__)
def test_each_error_class_says_whether_a_retry_can_help(cls: type[DdmqError]) -> None:
    assert issubclass(cls, DdmqError)
    assert cls.retriable is RETRIABLE[cls]


def test_errors_keep_the_builtin_kinds_their_callers_catch() -> None:
    assert issubclass(MessageTooLargeError, ValueError)
    assert issubclass(ExpressionError, ValueError)
    assert issubclass(ProxyConnectionError, ConnectionError)
    assert issubclass(EmbeddedRedisError, RuntimeError)
    assert issubclass(ProxyProcessError, RuntimeError)
    assert issubclass(DataLossError, RuntimeError)


def test_retriability_set_per_case() -> None:
    assert ProduceError("redis away").retriable is True
    with pytest.raises(ProduceError) as bad_meta:
        parse_queues("t", b"none")
    assert bad_meta.value.retriable is False
    gave_up = DeliveryError("t", "deadline passed", [], [0], [], 3, 1.0)
    refused = DeliveryError("t", "WRONGTYPE", [], [0], [], 0, 0.0, retriable=False)
    assert gave_up.retriable is True and refused.retriable is False and DeliveryError.retriable is True
    assert CliError("no such group").retriable is False and CliError("redis away", retriable=True).retriable
    assert PullError(1001, "unknown group").retriable is False and PullError(1006, "redis").retriable is True
    assert RemoteApplicationError(6, "internal error").code is None  # no code in the message: None, as before


def test_public_names_stay_importable_where_they_were() -> None:
    from ddmq.client import DeliveryError as client_delivery
    from ddmq.client import ProduceError as client_produce
    from ddmq.client import ProxyClientError as client_base
    from ddmq.client import PullError as client_pull
    from ddmq.client import RedisFullError as client_full
    from ddmq.protocol.produce.producer import MessageTooLargeError as producer_too_large

    assert (client_delivery, client_produce, client_base, client_pull, client_full, producer_too_large) == (
        DeliveryError, ProduceError, ProxyClientError, PullError, RedisFullError, MessageTooLargeError)
    assert proxy_errors.DdmqError is DdmqError and proxy_errors.ConfigError is ConfigError
