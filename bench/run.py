"""Entry point: ``python bench/run.py [--quick] [--json PATH] [--only P1,P3] [--profile]``.

A script rather than only a module so it runs from a checkout without installing the harness. The
script's own folder is taken off ``sys.path`` (its module names must not shadow anything) and the
repository root is appended (appended, so the checkout's top-level folders never shadow an installed
package); :mod:`bench.cli` does the work. ``python -m bench.run`` from the root works as well.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))
    from bench.cli import main

    sys.exit(main())
