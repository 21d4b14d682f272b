"""`recsys experiments`: list the shipped experiment gin files, or print one."""

import argparse
import sys

from recsys.cli import command


def _add_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument(
    "name", nargs="?", default=None, help="print this experiment's gin file."
  )


COMMAND = command.Command(
  name="experiments",
  help="list the shipped experiment gin files, or print one.",
  description="The experiment gin files installed with recsys. Pass a "
  "name to --gin_file from any directory, include it from your own gin "
  "file (include 'synthetic_dlrm.gin'), or print it to start your own.",
  epilog="example:\n  recsys experiments\n  recsys experiments "
  "synthetic_dlrm.gin > my_dlrm.gin",
  add_flags=_add_flags,
  # Reads files only: TensorFlow is not started.
  starts_tensorflow=False,
)


def run(args: argparse.Namespace) -> int:
  """Lists the shipped experiments, or prints the one named (an unknown
  name: `UnknownExperimentError`, listing the shipped ones)."""
  from recsys import experiments_catalog as catalog  # pylint: disable=g-import-not-at-top

  if args.name:
    sys.stdout.write(catalog.read_experiment(args.name))
    return 0
  shipped = catalog.list_experiments()
  width = max(len(x.name) for x in shipped)
  print(f"experiments shipped with recsys ({catalog.EXPERIMENTS_DIR}):")
  for x in shipped:
    print(f"  {x.name:<{width}}  {x.summary}")
  print(
    "\nuse: recsys train --gin_file synthetic_dlrm.gin --model_dir runs/demo;"
    " print one: recsys experiments NAME"
  )
  return 0
