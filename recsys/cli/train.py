"""`recsys train`: train the experiment the gin files describe."""

import argparse
from typing import Any

from recsys.cli import command, flags, gin_train, results


def _add_flags(parser: argparse.ArgumentParser) -> None:
  flags.add_gin_flags(parser, required=True)
  parser.add_argument(
    "--model_dir",
    required=True,
    help="where checkpoints, summaries and metrics go.",
  )
  parser.add_argument(
    "--no_progress",
    action="store_true",
    help="log lines instead of a progress bar.",
  )
  parser.add_argument(
    "--allow_changed_settings",
    action="store_true",
    help="resume the checkpoint in --model_dir although settings that "
    "change the math (data, model, optimizers, batch size, seed, ...) "
    "differ from the previous run's; refused by default, naming them.",
  )
  flags.add_skip_memory_check(parser)
  flags.add_runtime_flags(parser)


COMMAND = command.Command(
  name="train",
  help="train a model (resumes from --model_dir).",
  description="Train the experiment the gin files describe. An existing "
  "checkpoint in --model_dir is resumed at its step. Writes checkpoints, "
  "TensorBoard summaries, operative_config.gin and metrics.json there.",
  epilog="example:\n  recsys train --gin_file experiments/synthetic_dlrm.gin "
  "--model_dir runs/demo\n  recsys train "
  "--gin_file experiments/synthetic_dlrm.gin "
  "--gin_file experiments/hardware/cpu_2replicas.gin \\\n"
  "      --gin_bindings 'train.train_steps = 500' --model_dir runs/demo2",
  add_flags=_add_flags,
  starts_tensorflow=True,
)


def run(args: argparse.Namespace) -> int:
  metrics = gin_train.call_train(args)
  from recsys.run import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

  # In a multi-worker run every worker returns the metrics; one prints them.
  if strategy_lib.is_chief_task():
    results.print_metrics(metrics, args.verbosity)
    results.summary(COMMAND.name, _ending(args.model_dir, metrics))
  return 0


def _ending(model_dir: str, metrics: dict[str, Any]) -> str:
  """`recsys train`'s last line: nothing was trained if the run was
  complete already (and how to train again), the key metric reached (next
  to the best the data allows, where the source knows it) and the run
  folder."""
  from recsys.run import run_summaries  # pylint: disable=g-import-not-at-top

  step = metrics.get("step")
  parts = []
  if metrics.get("steps_trained") == 0:
    parts.append(
      f"nothing trained: {model_dir} was complete already at step {step} "
      "(metrics.json keeps the run that trained it). To train again, pass "
      "another --model_dir, or more steps: --gin_bindings "
      f"'train.train_steps = {2 * int(step or 0)}'."
    )
  reached = run_summaries.result_line(metrics)
  if reached:
    parts.append(f"The restored model: {reached}." if parts else f"{reached}.")
  if metrics.get("steps_trained") != 0:
    parts.append(
      f"Run folder: {model_dir} (metrics.json, checkpoints, TensorBoard "
      "summaries)."
    )
  return " ".join(parts)
