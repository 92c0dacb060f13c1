"""Redis access: the broker (streams, marks, produce), dead letters and their scripts, the embedded
Redis and Cluster.
"""
