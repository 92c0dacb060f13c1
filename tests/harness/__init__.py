"""The one harness of the tests, the soak and the benchmarks: a private Redis or Redis Cluster and real
proxy processes (:mod:`tests.harness.stack`), a load in a separate client process
(:mod:`tests.harness.clientproc`), and what a run records about its machine (:mod:`tests.harness.machine`).

``bench/`` imports it from here; nothing here imports ``bench/``.
"""
