"""`recsys benchmark movielens`: baselines vs. experiments over split seeds.

The suite parses its own flags (`recsys benchmark movielens --help`).
"""

import argparse
from typing import Any

from recsys.cli import flags

NAME = "benchmark"
#: The suite starts TensorFlow itself, in its training processes.
STARTS_TENSORFLOW = False


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
  parser = flags.subcommand(
    subparsers,
    NAME,
    help="`benchmark movielens`: baselines vs. experiments over split seeds.",
    description="Benchmark suites; each takes its own flags (see "
    "`recsys benchmark movielens --help`).",
  )
  parser.add_argument("suite", choices=("movielens",), help="the suite to run.")
  parser.add_argument(
    "suite_args",
    nargs=argparse.REMAINDER,
    metavar="...",
    help="the suite's flags.",
  )
  return parser


def run(args: argparse.Namespace) -> int:
  from recsys.tools import checkout_harness as movielens_benchmark  # pylint: disable=g-import-not-at-top

  movielens_benchmark.main(
    args.suite_args, prog=f"recsys benchmark {args.suite}"
  )
  return 0
