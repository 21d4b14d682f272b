"""The `recsys` command: one module per subcommand, flags only.

Examples:
  recsys train --gin_file experiments/synthetic_dlrm.gin --model_dir runs/demo
  recsys train --gin_file experiments/criteo_dcn.gin \\
      --gin_bindings "CRITEO_DIR = '/data/criteo'" --model_dir runs/dcn
  recsys train --gin_file experiments/movielens_ranking.gin \\
      --gin_bindings "MOVIELENS_DIR = '/data/ml-100k'" --model_dir runs/ml100k
  recsys evaluate --model_dir runs/demo
  recsys evaluate --model_dir runs/ml100k --eval_on seed1 \\
      --gin_bindings "MovieLens.seed = 1"
  recsys export --model_dir runs/demo --export_dir runs/demo/export
  recsys info --gin_file experiments/synthetic_dlrm.gin
"""

import argparse
import sys
from collections.abc import Sequence

import gin

from recsys import cli_checks
from recsys.cli import (
  benchmark,
  evaluate,
  experiments,
  export,
  info,
  launch,
  report,
  train,
  version,
)
from recsys.process import console, exits, startup

DESCRIPTION = (
  "Train, evaluate and export gin-configured recommender models "
  "whose embeddings run on CPU, GPU or any Cloud TPU."
)

#: Every subcommand, in `recsys --help`'s order: a module with its `COMMAND`
#: (a `recsys.cli.command.Command`: name, texts, flags) and `run(args) -> int`.
COMMANDS = {
  module.COMMAND.name: module
  for module in (train, evaluate, export, info, experiments, launch, benchmark)
}


def build_parser() -> argparse.ArgumentParser:
  """The argument parser of `recsys` and its subcommands."""
  parser = argparse.ArgumentParser(
    prog="recsys",
    description=DESCRIPTION,
    formatter_class=argparse.RawDescriptionHelpFormatter,
    epilog="Run `recsys <command> --help` for a command's flags.\n\n"
    + __doc__.split("\n", 2)[2],
  )
  parser.add_argument(
    "--version",
    action=version.PrintVersion,
    help="print the recsys, TensorFlow, Keras and Python versions.",
  )
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
  subparsers.required = True
  for module in COMMANDS.values():
    module.COMMAND.add_parser(subparsers)
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Entry point of the `recsys` console script and `python -m recsys`.

  Every command runs the same way: its files are checked before TensorFlow
  is imported (`cli_checks`), TensorFlow is started if the command needs it
  (`recsys.process.startup`), and an error or a signal ends it with the
  status `recsys.process.exits` gives it (a bad flag: argparse's 2).

  Args:
    argv: the command's arguments; None: this process's own command line
      (the process ends with the command: its exit skips the final garbage
      collection, `exits.skip_final_collection`).
  """
  status = _main(sys.argv[1:] if argv is None else argv)
  if argv is None:
    exits.skip_final_collection()
  return status


def _main(argv: Sequence[str]) -> int:
  """`main` of the arguments `argv`."""
  args = build_parser().parse_args(argv)
  module = COMMANDS[args.command]
  verbosity = getattr(args, "verbosity", None)
  verbose = verbosity == "debug"
  try:
    with exits.sigterm_exits(args.command):
      warnings = cli_checks.check(
        args.command,
        getattr(args, "gin_file", []),
        getattr(args, "model_dir", None),
        getattr(args, "gin_bindings", []),
        getattr(args, "k", None),
        getattr(args, "allow_unused_bindings", False),
      )
      for warning in warnings:
        print(f"recsys {args.command}: warning: {warning}", file=sys.stderr)
      if verbosity is not None:
        console.configure(args.command, verbosity)
      if module.COMMAND.starts_tensorflow:
        startup.start_tensorflow(
          verbose,
          getattr(args, "intra_op_threads", 0),
          getattr(args, "inter_op_threads", 0),
        )
      # Each command reads its own gin files: a second command in this
      # process (a notebook, a test) must not inherit the first one's
      # bindings, nor the lock its finalized config left.
      gin.clear_config()
      return module.run(args)
  except KeyboardInterrupt:  # Ctrl-C outside the training loop
    report.interrupted(args.command)
    return exits.INTERRUPTED_EXIT_STATUS
  except Exception as e:  # noqa: BLE001 - the status is `exits`' decision
    if "recsys.config" in sys.modules:  # TF's classes built by gin
      from recsys import config  # pylint: disable=g-import-not-at-top

      e = config.refused_arguments(e) or e
    status = exits.exit_status(e)
    if status is None or (verbose and status not in exits.STOPPED_BY_SIGNAL):
      raise
    report.failed(args.command, e, status, verbosity is not None)
    return status
