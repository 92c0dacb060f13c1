"""ddmq client SDK: producer, pull consumers and the wire contract (IDL, key names, queue hash)."""
