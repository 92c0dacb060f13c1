"""The IDL (``protocol/idl/consumerProxy.thrift``) loaded as thriftpy2 structs, with typed views of them.

thriftpy2 builds the struct classes at run time, so the type checker cannot see their fields; the
classes under ``TYPE_CHECKING`` describe them. ``tests/protocol/test_stubs.py`` holds those views to the
IDL (every struct, field, type and id), so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import thriftpy2
from thriftpy2.thrift import TException, TPayload

__all__ = [
    "IDL_PATH",
    "AckResult",
    "ConsumeResult",
    "ConsumeStats",
    "ConsumeStatsRequest",
    "ConsumerService",
    "Context",
    "FailDetail",
    "FetchRequest",
    "FetchResponse",
    "LeaseAck",
    "Message",
    "PullException",
    "PullRequest",
    "PullResponse",
    "QidResponse",
    "consumer_thrift",
    "iter_results",
    "link_results",
]

IDL_PATH: Final = Path(__file__).resolve().parent.parent / "idl" / "consumerProxy.thrift"

consumer_thrift: ModuleType = thriftpy2.load(str(IDL_PATH), module_name="consumerProxy_thrift")
"""The IDL loaded as a module: structs, ``ConsumerService`` and its ``<method>_args/_result``."""

ConsumerService: Any = consumer_thrift.ConsumerService


if TYPE_CHECKING:
    # Typed views of the classes thriftpy2 generates from the IDL (fields are None when unset).

    class Message(TPayload):
        key: str | None
        value: bytes | None
        tag: str | None
        offset: int | None
        properties: dict[str, str] | None
        produceTime: int | None

        def __init__(
            self,
            key: str | None = None,
            value: bytes | None = None,
            tag: str | None = None,
            offset: int | None = None,
            properties: dict[str, str] | None = None,
            produceTime: int | None = None,
        ) -> None: ...

    class Context(TPayload):
        groupId: str | None
        topic: str | None
        qid: str | None

        def __init__(self, groupId: str | None = None, topic: str | None = None, qid: str | None = None) -> None: ...

    class FailDetail(TPayload):
        offset: int | None
        retryAfterMs: int | None
        reason: str | None

        def __init__(
            self, offset: int | None = None, retryAfterMs: int | None = None, reason: str | None = None
        ) -> None: ...

    class ConsumeResult(TPayload):
        context: Context | None
        successOffsets: list[int] | None
        failOffsets: list[int] | None
        nextResult: ConsumeResult | None
        releaseOffsets: list[int] | None
        extendOffsets: list[int] | None
        failDetails: list[FailDetail] | None

        def __init__(
            self,
            context: Context | None = None,
            successOffsets: list[int] | None = None,
            failOffsets: list[int] | None = None,
            nextResult: ConsumeResult | None = None,
            releaseOffsets: list[int] | None = None,
            extendOffsets: list[int] | None = None,
            failDetails: list[FailDetail] | None = None,
        ) -> None: ...

    class PullRequest(TPayload):
        groupId: str | None
        topic: str | None
        maxBatchSize: int | None
        maxLingerTime: int | None
        result: ConsumeResult | None
        version: str | None
        leaseId: str | None
        leaseIndex: int | None
        leaseTimeoutMs: int | None
        maxPerKey: int | None
        requestId: str | None

        def __init__(
            self,
            groupId: str | None = None,
            topic: str | None = None,
            maxBatchSize: int | None = None,
            maxLingerTime: int | None = None,
            result: ConsumeResult | None = None,
            version: str | None = None,
            leaseId: str | None = None,
            leaseIndex: int | None = None,
            leaseTimeoutMs: int | None = None,
            maxPerKey: int | None = None,
            requestId: str | None = None,
        ) -> None: ...

    class PullResponse(TPayload):
        context: Context | None
        messages: list[Message] | None
        runs: list[int] | None

        def __init__(
            self, context: Context | None = None, messages: list[Message] | None = None, runs: list[int] | None = None
        ) -> None: ...

    class ConsumeStatsRequest(TPayload):
        group: str | None
        topic: str | None
        version: str | None

        def __init__(self, group: str | None = None, topic: str | None = None, version: str | None = None) -> None: ...

    class ConsumeStats(TPayload):
        group: str | None
        topic: str | None
        consumeOffsets: dict[str, int] | None
        produceOffsets: dict[str, int] | None
        owners: dict[str, str] | None
        leaseTtlMs: dict[str, int] | None
        leaseTerms: dict[str, int] | None
        expired: dict[str, int] | None
        expiredLast: dict[str, str] | None

        def __init__(
            self,
            group: str | None = None,
            topic: str | None = None,
            consumeOffsets: dict[str, int] | None = None,
            produceOffsets: dict[str, int] | None = None,
            owners: dict[str, str] | None = None,
            leaseTtlMs: dict[str, int] | None = None,
            leaseTerms: dict[str, int] | None = None,
            expired: dict[str, int] | None = None,
            expiredLast: dict[str, str] | None = None,
        ) -> None: ...

    class FetchRequest(TPayload):
        consumerId: str | None
        groupId: str | None
        cluster: str | None
        fetchOffset: dict[str, dict[str, int]] | None
        maxBatchSize: int | None
        maxLingerTime: int | None
        version: str | None

        def __init__(
            self,
            consumerId: str | None = None,
            groupId: str | None = None,
            cluster: str | None = None,
            fetchOffset: dict[str, dict[str, int]] | None = None,
            maxBatchSize: int | None = None,
            maxLingerTime: int | None = None,
            version: str | None = None,
        ) -> None: ...

    class QidResponse(TPayload):
        topic: str | None
        qid: str | None
        nextRequestOffset: int | None
        messages: list[Message] | None

        def __init__(
            self,
            topic: str | None = None,
            qid: str | None = None,
            nextRequestOffset: int | None = None,
            messages: list[Message] | None = None,
        ) -> None: ...

    class FetchResponse(TPayload):
        code: int | None
        results: list[QidResponse] | None

        def __init__(self, code: int | None = None, results: list[QidResponse] | None = None) -> None: ...

    class AckResult(TPayload):
        consumerId: str | None
        groupId: str | None
        cluster: str | None
        offsets: dict[str, dict[str, int]] | None

        def __init__(
            self,
            consumerId: str | None = None,
            groupId: str | None = None,
            cluster: str | None = None,
            offsets: dict[str, dict[str, int]] | None = None,
        ) -> None: ...

    class LeaseAck(TPayload):
        groupId: str | None
        leaseIds: list[str] | None
        abandon: bool | None

        def __init__(
            self, groupId: str | None = None, leaseIds: list[str] | None = None, abandon: bool | None = None
        ) -> None: ...

    class PullException(TException):
        code: int | None
        message: str | None

        def __init__(self, code: int | None = None, message: str | None = None) -> None: ...

else:
    Message = consumer_thrift.Message
    Context = consumer_thrift.Context
    FailDetail = consumer_thrift.FailDetail
    ConsumeResult = consumer_thrift.ConsumeResult
    PullRequest = consumer_thrift.PullRequest
    PullResponse = consumer_thrift.PullResponse
    ConsumeStatsRequest = consumer_thrift.ConsumeStatsRequest
    ConsumeStats = consumer_thrift.ConsumeStats
    FetchRequest = consumer_thrift.FetchRequest
    QidResponse = consumer_thrift.QidResponse
    FetchResponse = consumer_thrift.FetchResponse
    AckResult = consumer_thrift.AckResult
    LeaseAck = consumer_thrift.LeaseAck
    PullException = consumer_thrift.PullException


def iter_results(head: ConsumeResult | None) -> Iterator[ConsumeResult]:
    """Walk a ``ConsumeResult`` list through ``nextResult`` (without recursion)."""
    node = head
    while node is not None:
        yield node
        node = node.nextResult


def link_results(nodes: Iterable[ConsumeResult]) -> ConsumeResult | None:
    """Chain ``nodes`` through ``nextResult`` in the given order; None for no nodes."""
    head: ConsumeResult | None = None
    for node in reversed(list(nodes)):
        node.nextResult = head
        head = node
    return head
