"""The Redis layout both sides agree on: key names (``keys``), connections with deadlines
(``connection``), a message as a stream entry (``stream_entry``), a topic's metadata and what makes a
queue appendable (``queues``), the queue a key hashes to (``hashing``), the Lua scripts (``scripts``) and
a group's status read from Redis (``status``).
"""
