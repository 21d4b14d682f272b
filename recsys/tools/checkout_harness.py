"""`recsys benchmark movielens`: runs the checkout's research harness.

The harness (baselines, seeds, tables; benchmarks/movielens_benchmark.py) is
not part of the library; this door finds it beside the package in a source
checkout (an editable install) and says so when it is not there.
"""

import importlib
import os
import sys
from collections.abc import Sequence

from recsys.errors import RecsysError

CHECKOUT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
HARNESS = os.path.join(CHECKOUT, "benchmarks", "movielens_benchmark.py")


class HarnessNotFoundError(RecsysError, FileNotFoundError):
  """The installed package has no checkout (benchmarks/) beside it."""


def main(
  argv: Sequence[str] | None = None, prog: str = "recsys benchmark movielens"
) -> None:
  """Runs benchmarks/movielens_benchmark.py's `main` with these arguments."""
  if not os.path.isfile(HARNESS):
    raise HarnessNotFoundError(
      f"{prog} runs benchmarks/movielens_benchmark.py from a source checkout "
      f"(git clone; pip install -e .); it is not at {HARNESS}"
    )
  if CHECKOUT not in sys.path:
    sys.path.insert(0, CHECKOUT)
  harness = importlib.import_module("benchmarks.movielens_benchmark")
  harness.main(argv, prog=prog)
