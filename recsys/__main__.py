"""`python -m recsys`: the same command as the `recsys` console script."""

import sys

from recsys.cli import main

if __name__ == "__main__":
  sys.exit(main())
