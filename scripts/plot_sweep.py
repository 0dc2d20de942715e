"""Draw a multirun folder: a thin wrapper of the installed ``fnsysid-plot`` command.

Usage: python scripts/plot_sweep.py SWEEP_DIR [options]   (see ``fnsysid-plot --help``)
"""

import sys

from fnsysid.app.plot_cli import main

if __name__ == "__main__":
    sys.exit(main())
