"""What the proxy and its clients share, by concern:

- ``wire/``: the Thrift contract (the IDL in ``idl/``, its structs, the framed compact codec; the
  proxy's own hand-written pull-reply encoder is ``ddmq.proxy.core.pull_codec``);
- ``redis/``: the Redis layout (key names, connections, stream entries, topic metadata, the queue hash,
  the Lua scripts, a group's status);
- ``produce/``: the producers and their retries;
- ``errors``: the one error tree (codes, ``retriable``) both sides raise and read;
- ``native``: which modules the compiled hot path covers; ``clitools``: what both command lines share;
  ``net``: free ports for what the project starts on this host.

It imports neither ``ddmq.client`` nor ``ddmq.proxy`` (``tests/test_layers.py`` holds it to that).
"""
