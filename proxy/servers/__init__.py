"""Network adapters: the shared listener and byte budget, the Thrift server and the HTTP server."""
