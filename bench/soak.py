"""Entry point of the fault soak: ``python bench/soak.py [--messages N] [--quick] [--json PATH]``.

The soak checks correctness (nothing lost, every key in order, one reader per lease term) under
crashes, so it lives with the tests, in ``tests/soak.py``; this script runs it from a checkout, as
``bench/run.py`` runs the benchmarks (its own folder off ``sys.path``, the repository root appended).
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))
    from tests.soak import main

    sys.exit(main())
