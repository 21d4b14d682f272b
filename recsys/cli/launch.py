"""`recsys launch`: run a command on a local cluster (chief, workers, ps)."""

import argparse

from recsys import launch as launch_lib
from recsys.cli import command

COMMAND = command.Command(
  name="launch",
  help="run a command on a local cluster (chief, workers, ps).",
  description="Start a small TF_CONFIG cluster of processes on this "
  "machine (127.0.0.1, free ports) that all run the command after `--`: "
  "with --ps > 0 a chief, workers and parameter servers "
  "(ParameterServerStrategy, 'parameter_servers' tables); with --ps 0 "
  "workers of a "
  "MultiWorkerMirroredStrategy. The chief's lines are printed, prefixed "
  "with its name; every other task's output goes to "
  "<model_dir>/logs/<task>.log (its error lines printed too). Every "
  "process is stopped when the chief exits or a task the cluster cannot "
  "lose fails; SIGTERM and Ctrl-C are forwarded to the chief, which saves "
  "a checkpoint within --grace_seconds before the others are stopped "
  "(exit status 143 or 130). No task outlives the launcher, even a "
  "SIGKILLed one: the kernel sends its tasks SIGTERM.",
  epilog="example:\n  recsys launch --workers 2 --ps 2 -- train "
  "--gin_file experiments/synthetic_dlrm.gin \\\n"
  "      --gin_file experiments/hardware/local_cluster.gin "
  "--model_dir runs/ps\n"
  "  recsys launch --workers 2 --ps 0 -- train "
  "--gin_file experiments/synthetic_dlrm.gin \\\n"
  "      --gin_file experiments/hardware/local_cluster_row_sharded.gin "
  "--model_dir runs/workers_row_sharded",
  add_flags=launch_lib.add_arguments,
  # Starts processes (each its own `recsys`): TensorFlow is not started here.
  starts_tensorflow=False,
)


def run(args: argparse.Namespace) -> int:
  """The cluster's status (`LaunchError`: it cannot start as asked)."""
  return launch_lib.run(args)
