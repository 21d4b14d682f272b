"""`recsys benchmark movielens`: runs the checkout's research harness.

The harness (baselines, seeds, tables; benchmarks/movielens_benchmark.py) is
not part of the library, and the package never imports `benchmarks`, which
sits above it (tests/test_layering.py refuses such an import): this door
finds the script beside the package in a source checkout (an editable
install), runs its file as Python runs a script (`runpy.run_path`; the
script puts its checkout on `sys.path` for its own imports) and calls its
`main` in this process, so the command's output, errors and exit status
are the script's. It says where it looked when there is no checkout.
"""

import os
import runpy
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
  # Not "__main__": the script's own `main()` call stays unrun; ours passes
  # the arguments and the command's name.
  harness = runpy.run_path(HARNESS, run_name="movielens_benchmark")
  harness["main"](argv, prog=prog)
