"""ddmq consume proxy: ordered, per-key consumption of Redis Streams for thin pull clients.

Its subpackages are its layers, bottom first (a module imports only from its own layer or below;
DESIGN.md, "Layers"; ``tests/test_layers.py`` checks it):

- ``core``: the error tree and the plain value types
- ``store``: Redis access (:class:`~ddmq.proxy.store.broker.Broker`), dead letters, the embedded Redis
- ``engine``: one queue's messages: jobs, the per-key gate, offsets, the reader, the pull buffer,
  redelivery, replay leases
- ``cluster``: leases, membership, ownership of queues, commits
- ``groups``: the runtime of one consumer group (its topics, chains and readers), and the registry of
  running groups that builds, starts, replaces and retires them (start-up and reload alike)
- ``api``: :class:`~ddmq.proxy.api.surface.ConsumeService`, the one surface both servers call, its
  implementation :class:`~ddmq.proxy.api.consume.ConsumeApi`, the request rules, the low-level fetch/ack
- ``ops``: metrics, admin snapshots, lag, watching the config file
- ``servers``: the Thrift and HTTP adapters and what they share (listener, byte budget)
- ``service`` and ``cli``: the process's life cycle
"""
