"""`python -m gatehead.cli`, as the `gatehead` console script."""

import sys

from gatehead.cli import main

if __name__ == "__main__":
    sys.exit(main())
