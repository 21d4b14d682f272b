"""`recsys evaluate`: evaluate the latest checkpoint of a model dir."""

import argparse
import logging

from recsys.cli import command, flags, gin_train, results

log = logging.getLogger("recsys")


def _add_flags(parser: argparse.ArgumentParser) -> None:
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
  flags.add_restore_refusal_flags(parser, "evaluate")
  flags.add_runtime_flags(parser)


COMMAND = command.Command(
  name="evaluate",
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
  add_flags=_add_flags,
  starts_tensorflow=True,
)


def run(args: argparse.Namespace) -> int:
  from recsys.model_dir import run_dir  # pylint: disable=g-import-not-at-top
  from recsys.run import run_summaries  # pylint: disable=g-import-not-at-top
  from recsys.run.evaluation import evaluate_restored  # pylint: disable=g-import-not-at-top

  run = run_dir.RunDir(args.model_dir)
  name = args.eval_on
  path = run.other_eval_metrics(name) if name else run.eval_metrics
  # Reads the model dir only; nothing of recsys.training is loaded.
  # The tables alone, without the optimizer's slots.
  restored = gin_train.configured(args, action="restore").restored(
    lookup_only=True
  )
  metrics, changes = evaluate_restored(restored, other_data=bool(name))
  if name:
    metrics["eval_on"] = name
  printed = dict(metrics)
  if name:  # what the other data was, next to its results
    metrics["eval_input_files"] = restored.input_fingerprints(eval_only=True)
  try:  # a convenience copy; a read-only model dir (e.g. a shared run) is fine
    run.write_eval_metrics(metrics, name)
    if changes:
      run.record_changes("evaluate", restored.restored_step, changes, path)
    kept = f"kept in {path}"
  except OSError as e:
    log.warning("%s not written (%s)", path, e.strerror or e)
    kept = f"not kept ({path} not writable): the JSON above holds them"
  if kept.startswith("kept"):
    results.print_metrics(printed, args.verbosity)
  else:  # the only copy
    results.print_metrics(printed, "info")
  examples = metrics.get("eval/examples")
  on = f" on {int(examples):,} examples" if examples else ""
  reached = run_summaries.result_line(metrics) or "evaluated"
  results.summary(COMMAND.name, f"{reached}{on}; {kept}.")
  return 0
