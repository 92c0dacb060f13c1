/*
 * ddmq consume proxy: the Thrift contract of ConsumerService.
 *
 * Wire: framed transport (4-byte big-endian length, then one message) and the compact protocol.
 * Default port 9713. Field ids and types are those of DDMQ's consumer proxy, so DDMQ's own client
 * SDKs (Java, Go, C++) talk to ddmq-proxy unchanged.
 *
 * PullException.code (see proxy/core/errors.py for the error classes behind each code):
 *   1001  unknown group
 *   1002  unknown topic
 *   1003  bad request (e.g. a missing required field)
 *   1004  not supported by this proxy
 *   1005  unavailable: the proxy is shutting down or not ready; retry elsewhere or later
 *   1006  broker (Redis) error; retriable
 *   1500  internal error (logged with a traceback by the proxy)
 * fetch and ack declare no exception, so their errors reach the client as a TApplicationException
 * whose message starts with the code.
 *
 * Evolution: new capabilities only add optional fields under new ids; an existing id never changes
 * its type or meaning, and a removed field's id is never reused.
 */

namespace java com.ddmq.proxy.thrift
namespace go ddmq.proxy.thrift

struct Message {
    1: string key;
    2: binary value;
    3: string tag;
    4: i64 offset;
    5: optional map<string, string> properties;
    /* ddmq extension: produce time, milliseconds since the epoch (0 when the producer gave none). */
    20: optional i64 produceTime;
}

/* One queue of one topic, as a consumer group sees it; qid is the queue number as a string. */
struct Context {
    1: string groupId;
    2: string topic;
    3: string qid;
}

/*
 * ddmq extension: a failure with the client's words. retryAfterMs asks for the next attempt that many
 * milliseconds from now instead of the group's retry interval (capped by the topic's
 * max_retry_after_ms); reason (at most 1 KiB kept) is stored as the message's last error.
 */
struct FailDetail {
    1: i64 offset;
    2: optional i32 retryAfterMs;
    3: optional string reason;
}

/* Acks and fails for one (topic, qid); a list of queues is linked through nextResult. */
struct ConsumeResult {
    1: Context context;
    3: list<i64> successOffsets;
    4: list<i64> failOffsets;
    10: optional ConsumeResult nextResult;
    /*
     * ddmq extensions, under the rule of acks (only offsets delivered to this group count; others are
     * ignored and counted). releaseOffsets: given back unprocessed, no attempt counted, delivered again
     * first in their key. extendOffsets: still being worked on, the delivery deadline restarts (at most
     * the topic's max_extensions per delivery). failDetails: failed (whether or not also in
     * failOffsets), with a retry delay and a reason. Old clients never send these and see no change.
     */
    80: optional list<i64> releaseOffsets;
    81: optional list<i64> extendOffsets;
    82: optional list<FailDetail> failDetails;
}

struct PullRequest {
    1: required string groupId;
    2: optional string topic;
    10: optional i32 maxBatchSize;
    /* Milliseconds to wait for messages when none are ready. */
    11: optional i32 maxLingerTime;
    /* Results of earlier pulls, applied before this pull is served. */
    50: optional ConsumeResult result;
    60: optional string version;
    /*
     * ddmq extension: replayable pulls (used by the Spark source). A pull naming a lease is
     * remembered by the proxy that served it: pulling the same (leaseId, leaseIndex) again answers the
     * same messages, until the lease is acked (ackLeases) or expires. Index 0 starts a lease; a reader
     * continues it with 1, 2, ... (one more than the pulls made so far); an unknown lease answers
     * empty for index > 0. The messages stay in flight for leaseTimeoutMs (default: the topic's
     * timeout_ms, at most one hour), then count as a failed attempt and are redelivered as usual;
     * a lease whose messages moved on is dropped and answers empty. Replays must go to the same
     * proxy. Old clients never set these fields and see no change.
     */
    70: optional string leaseId;
    71: optional i32 leaseIndex;
    72: optional i32 leaseTimeoutMs;
    /*
     * ddmq extension: ordered runs. The most successive messages of one order key (with QID order:
     * of one queue) this reply may carry; absent, 0 or 1: one message per key. A reply's messages of a
     * key are consecutive, in the key's order; the client processes them in that order and stops at
     * the first failure: it acks the processed prefix and fails the message that failed. The
     * unacked messages after a failed (or timed-out) one are delivered again, in order, once it is
     * finished; an ack for a message whose predecessors in the reply are unfinished is ignored.
     */
    80: optional i32 maxPerKey;
    /*
     * ddmq extension: a retriable pull. An id the client picks per logical pull (1 to 128 characters;
     * a UUID, say) and sends again, unchanged with the rest of the request, when it retries that pull
     * after a lost reply (connection reset, EOF): the proxy that served the first try answers the same
     * messages at once, those still in flight under that delivery, with the same deadlines, and does
     * not apply the retry's results again; when none is left in flight the retry is a new pull. Ids are
     * remembered per group by the proxy that served the pull (a bounded number, the oldest forgotten
     * first): a retry reaching another proxy is a new pull there. Ignored under a leaseId. Old clients
     * never set it and see no change.
     */
    90: optional string requestId;
}

/* Messages of the single (topic, qid) named by context; empty when none arrived in time. */
struct PullResponse {
    1: Context context;
    2: list<Message> messages;
    /*
     * ddmq extension, set only when the request asked for ordered runs (maxPerKey) and the reply
     * carries some: the sizes of the reply's consecutive groups of one order key, in message order
     * (they add up to the number of messages). A client processes each group in order and stops a
     * group at its first failure; different groups may be processed in parallel.
     */
    80: optional list<i32> runs;
}

struct ConsumeStatsRequest {
    1: required string group;
    2: optional string topic;
    3: optional string version;
}

/* Offsets keyed by qid (as a string). */
struct ConsumeStats {
    1: string group;
    2: string topic;
    3: map<string, i64> consumeOffsets;
    4: map<string, i64> produceOffsets;
    /* ddmq extensions, keyed by qid like the maps above; a queue nobody holds is absent. */
    /* Instance id of the proxy holding the queue's lease. */
    20: optional map<string, string> owners;
    /* Milliseconds until that lease expires unless renewed. */
    21: optional map<string, i64> leaseTtlMs;
    /* The lease's term (the fencing token; it grows with every change of owner). */
    22: optional map<string, i64> leaseTerms;
    /* Entries the group never received: trimmed from Redis before it read them (a retention cap, an
       idle group, a producer's maxlen). Only queues with such a loss; the latest range as "first..last". */
    23: optional map<string, i64> expired;
    24: optional map<string, string> expiredLast;
}

struct FetchRequest {
    1: required string consumerId;
    2: required string groupId;
    3: required string cluster;
    /* topic -> qid -> first offset to read (a queue starts at 1; -1 = the position stored by ack).
       Unset: every queue of the group from its stored position. */
    4: optional map<string, map<string, i64>> fetchOffset;
    /* Messages per queue: default 64, at most 10000; 0 = positions only. */
    10: optional i32 maxBatchSize;
    11: optional i32 maxLingerTime;
    60: optional string version;
}

struct QidResponse {
    1: required string topic;
    2: required string qid;
    /* The offset to fetch next: one past the last message returned, or the asked-for start. */
    3: optional i64 nextRequestOffset;
    10: required list<Message> messages;
}

struct FetchResponse {
    1: optional i32 code;
    10: required list<QidResponse> results;
}

struct AckResult {
    1: required string consumerId;
    2: required string groupId;
    3: required string cluster;
    /* topic -> qid -> the group's next offset to fetch (ack nextRequestOffset) */
    4: required map<string, map<string, i64>> offsets;
}

/* ddmq extension: acknowledge every message of the named pull leases (see PullRequest.leaseId). */
struct LeaseAck {
    1: required string groupId;
    2: required list<string> leaseIds;
    /* true: the reader gave these leases up (their proxy was gone); no later ack finishes their messages */
    3: optional bool abandon;
}

exception PullException {
    1: i32 code;
    2: string message;
}

service ConsumerService {
    PullResponse pull(1: PullRequest request) throws (1: PullException error);

    bool submit(1: ConsumeResult result) throws (1: PullException error);

    list<ConsumeStats> getConsumeStats(1: ConsumeStatsRequest request) throws (1: PullException error);

    /* Low-level API: the client names per-(topic, qid) offsets; no ordering gates. */
    FetchResponse fetch(1: FetchRequest request);

    bool ack(1: AckResult result);

    /* ddmq extension: ack the messages of pull leases; answers how many messages this proxy held
     * and acked. A lease another proxy served is acked from its record in Redis (its messages are
     * finished for the queue's owner; counted 0); unknown or expired lease ids are ignored. With
     * abandon, the leases are marked given up instead, and no later ack finishes their messages. */
    i32 ackLeases(1: LeaseAck request) throws (1: PullException error);
}
