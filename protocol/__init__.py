"""What the proxy and its clients share: the wire contract and the Redis layout.

- the Thrift contract: the IDL and its structs (``structs``), the compact reader and writer (``reader``,
  ``message_reader``, ``writer``), the numbers and the ``Message`` layout they share (``layout``), all of
  it in one import (``wire``), and the proxy's hand-written pull reply encoder (``pull_codec``);
- Redis: key names (``keys``), connections (``connection``), a message as a stream entry
  (``stream_entry``), the produce script and topic metadata (``queues``), the producer (``producer``),
  the queue hash (``hashing``) and a group's status (``status``);
- ``clitools``, the helpers both command lines (``ddmq``, ``ddmq-proxy``) use.

It imports neither ``ddmq.client`` nor ``ddmq.proxy`` (``tests/test_layers.py`` holds it to that).
"""
