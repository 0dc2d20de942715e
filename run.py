"""Entry point: ``python run.py [overrides]``; see ``python run.py --help``."""

from fnsysid.app.cli import main

if __name__ == "__main__":
    main()
