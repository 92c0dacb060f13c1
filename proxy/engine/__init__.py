"""The per-message engine of one queue: jobs, the per-key gate, offsets, the reader, the pull buffer,
redelivery, replays.
"""
