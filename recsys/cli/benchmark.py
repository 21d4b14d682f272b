"""`recsys benchmark movielens`: baselines vs. experiments over split seeds.

The suite parses its own flags (`recsys benchmark movielens --help`).
"""

import argparse

from recsys.cli import command


def _add_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("suite", choices=("movielens",), help="the suite to run.")
  parser.add_argument(
    "suite_args",
    nargs=argparse.REMAINDER,
    metavar="...",
    help="the suite's flags.",
  )


COMMAND = command.Command(
  name="benchmark",
  help="`benchmark movielens`: baselines vs. experiments over split seeds.",
  description="Benchmark suites; each takes its own flags (see "
  "`recsys benchmark movielens --help`).",
  add_flags=_add_flags,
  # The suite starts TensorFlow itself, in its training processes.
  starts_tensorflow=False,
)


def run(args: argparse.Namespace) -> int:
  from recsys.tools import checkout_harness as movielens_benchmark  # pylint: disable=g-import-not-at-top

  movielens_benchmark.main(
    args.suite_args, prog=f"recsys benchmark {args.suite}"
  )
  return 0
