"""``python -m ddmq.client.cli``: the ``ddmq`` command, as its entry point runs it."""

import sys

from ddmq.client.cli.main import main

sys.exit(main())
