"""ddmq consume proxy: ordered, per-key consumption of Redis Streams for thin pull clients.

The engine lives in small modules, one noun each (the main ones):

- ``broker``: Redis Streams access (read, produce, commit, dead letters, topic metadata)
- ``ordering``: :class:`UpstreamJobBlockingQueue`, the per-order-key gate
- ``pull_buffer``: :class:`PullBuffer`, ready jobs, long polls, in-flight jobs, ordered runs
- ``redelivery``: :class:`Redelivery`, deadlines of jobs in flight, retries, dead-letter writes
- ``replays``: :class:`ReplayLeases`, replayable pulls (Spark)
- ``offsets``: :class:`OffsetTracker`, the committable prefix per queue
- ``reader``: :class:`QueueReader`, one per queue, in order, backpressured
- ``group``: the runtime of one consumer group (its topics, chains and readers)
- ``fetch``: the low-level ``fetch``/``ack`` (client-owned offsets, no ordering)
- ``service``: :class:`ProxyService`, the process: lifecycle, groups, and the ConsumeService surface
- ``requests``: the request rules (linger, batch size, maxPerKey, offsets per request) both servers share
- ``api``: :class:`ConsumeService`, the one surface the server adapters call
- ``thrift_server`` / ``thrift_handler`` and ``http_server``: the Thrift and HTTP adapters
"""
