"""`recsys evaluate`: evaluate the latest checkpoint of a model dir."""

import argparse
import json
import logging
from typing import Any

from recsys.cli import flags, gin_train

NAME = "evaluate"
#: The command needs TensorFlow started (`recsys.runtime.startup`).
STARTS_TENSORFLOW = True

log = logging.getLogger("recsys")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
  parser = flags.subcommand(
    subparsers,
    NAME,
    help="evaluate the latest checkpoint of a model dir.",
    description="Restore the latest checkpoint of --model_dir and evaluate "
    "it; prints the metrics as JSON and, if the model dir is writable, "
    "keeps them in eval_metrics.json (nothing else is written, but a line "
    "in changed_settings.jsonl for allowed changes). Without "
    "--gin_file the run's own operative_config.gin is used; settings or "
    "data files that differ from the run's are refused, naming them "
    "(--eval_on NAME evaluates on other data on purpose).",
    epilog="example:\n  recsys evaluate --model_dir runs/demo\n"
    "  recsys evaluate --model_dir runs/demo "
    "--gin_bindings 'train.eval_steps = None'",
  )
  flags.add_gin_flags(parser, required=False)
  parser.add_argument("--model_dir", required=True)
  parser.add_argument(
    "--eval_on",
    default=None,
    metavar="NAME",
    help="evaluate on other data on purpose: the data settings given with "
    "--gin_file/--gin_bindings (and the data files) may differ from the "
    "run's, the model's may not; the results go to "
    "eval_metrics-NAME.json, never to eval_metrics.json.",
  )
  parser.add_argument(
    "--exclude_seen",
    action="store_true",
    help="retrieval: rank for each held-out pair only the candidates its "
    "user did not interact with in training (train.exclude_seen).",
  )
  flags.add_allow_changed_settings(parser, NAME)
  flags.add_skip_memory_check(parser)
  flags.add_runtime_flags(parser)
  return parser


def run(args: argparse.Namespace) -> int:
  from recsys.run.evaluation import evaluate_restored  # pylint: disable=g-import-not-at-top
  from recsys.run_folder import run_dir  # pylint: disable=g-import-not-at-top

  run = run_dir.RunDir(args.model_dir)
  name = args.eval_on
  path = run.other_eval_metrics(name) if name else run.eval_metrics
  # Reads the model dir only; nothing of recsys.training is loaded.
  restored = gin_train.configured(args, action="restore").restored()
  metrics, changes = evaluate_restored(restored, other_data=bool(name))
  if name:
    metrics["eval_on"] = name
  print(json.dumps(metrics, indent=2, sort_keys=True))
  if name:  # what the other data was, next to its results
    metrics["eval_input_files"] = restored.input_fingerprints(eval_only=True)
  try:  # a convenience copy; a read-only model dir (e.g. a shared run) is fine
    run.write_eval_metrics(metrics, name)
    if changes:
      run.record_changes("evaluate", restored.restored_step, changes, path)
  except OSError as e:
    log.warning(
      "%s not written (%s); the metrics are printed above",
      path,
      e.strerror or e,
    )
  return 0
