"""The benchmark harness of ddmq-proxy: ``python bench/run.py [--quick]`` (see bench/README.md).

Every figure is a ratio of the proxy to a raw Redis Streams baseline measured side by side in the
same run on the same data, because the machines it runs on are small and shared.
"""
