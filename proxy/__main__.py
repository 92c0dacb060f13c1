import sys

from ddmq.proxy.cli import main

sys.exit(main())
