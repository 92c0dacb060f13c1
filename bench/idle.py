"""Entry point of the idle-cost bench: ``python bench/idle.py [--quick] [--rows 8,800,8000] [--json PATH]``.

What an idle proxy costs (CPU, Redis commands, memory, start-up) by the number of queues it holds,
and, with ``--busy``, P1's throughput with many idle groups beside the busy one. The work is in
:mod:`bench.idlecost`; this script runs it from a checkout, as ``bench/run.py`` runs the scenarios
(its own folder off ``sys.path``, the repository root appended).
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))
    from bench.idlecost import main

    sys.exit(main())
