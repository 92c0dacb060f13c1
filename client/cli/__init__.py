"""The ``ddmq`` command line: ``main`` dispatches to one module per command group (``produce``,
``consume``, ``status``, ``groups``, ``topics``, ``keys``, ``offsets``, the admin API's ``admin``, the
``demo``); ``group_registry`` and ``proxy_process`` are what those commands read and launch.
"""
