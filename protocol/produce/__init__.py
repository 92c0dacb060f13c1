"""Producing to a topic: the producers (``producer``), one produce call's steps (``steps``) and its
sending and retries (``calls``), and how a failed delivery is retried and reported (``delivery``).

``ddmq.client`` re-exports the public names (``Producer``, ``AsyncProducer``, ``DeliveryError``, ...).
"""
