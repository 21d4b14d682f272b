"""`recsys export`: a SavedModel of a model dir's latest checkpoint."""

import argparse
import json
import logging
import os

from recsys.cli import command, flags, gin_train
from recsys.process import console

log = logging.getLogger("recsys")


def _add_flags(parser: argparse.ArgumentParser) -> None:
  flags.add_gin_flags(parser, required=False)
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--export_dir", required=True)
  parser.add_argument(
    "--k",
    type=flags.positive_int,
    default=None,
    metavar="K",
    help="retrieval: candidates the top-k signatures (serving_default, "
    "serving_raw, top_k, top_k_raw) return per query, at most the corpus "
    "size (default: 100, or the whole corpus if it holds fewer). Refused "
    "for ranking models.",
  )
  flags.add_restore_refusal_flags(parser, "export")
  flags.add_verbose(parser)


COMMAND = command.Command(
  name="export",
  help="export a SavedModel that serves on CPU.",
  description="Restore the latest checkpoint of --model_dir (trained with "
  "any backend) and write a SavedModel whose serving_default signature "
  "takes the data source's ids and returns scores (ranking) or top-k "
  "candidates (retrieval); for Criteo and MovieLens, serving_raw takes "
  "raw values (TSV columns, raw user/item ids) and applies the training "
  "hashing and vocabularies in the graph.",
  epilog="example:\n  recsys export --model_dir runs/demo "
  "--export_dir runs/demo/export",
  add_flags=_add_flags,
  starts_tensorflow=True,
)


def run(args: argparse.Namespace) -> int:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from backends import registry  # pylint: disable=g-import-not-at-top
  from recsys import planning  # pylint: disable=g-import-not-at-top
  from recsys.serving import export as export_lib  # pylint: disable=g-import-not-at-top

  # The export's backend (the registry's `for_export`) restores a
  # checkpoint of any training backend (SparseCore's stacked tables
  # included) on CPU; the export copies its tables without the optimizer
  # slots. Where the training devices held the tables and how
  # (train.placement: placement, exchange, table_dtype, a device's memory)
  # does not apply here, nor do the training backend's options: the
  # export's tables are float32, and a narrow (bfloat16/float16) table
  # is restored into them by an exact cast (backends.checkpoint.casting_tables;
  # docs/serving.md).
  configured = gin_train.configured(
    args,
    [
      "train.progress_bar = False",
      "train.summaries = False",
      "train.placement = None",
      *planning.default_placement_bindings(),
      "train.backend_options = None",
    ],
    action="restore",
    backend=registry.for_export(),
    strategy=tf.distribute.get_strategy(),
  )
  # The tables alone (no slots); nothing of recsys.training is loaded.
  restored = configured.restored(lookup_only=True)
  step = restored.require_checkpoint("export")
  changes = restored.check_restored("export")
  log.info(  # tracing the signatures (and a corpus's index) takes seconds
    "exporting step %d of %s ...",
    step,
    args.model_dir,
    extra=console.shown_as(console.STATUS),
  )
  provenance = {
    "model_dir": os.path.abspath(args.model_dir),
    "step": step,
    "changed_settings": changes.lines(),
    "input_files": restored.input_fingerprints(),
  }
  path = export_lib.export(
    restored,
    args.export_dir,
    k=args.k,
    extra_files={export_lib.PROVENANCE_FILE: json.dumps(provenance, indent=2)},
  )
  if changes:
    restored.run_dir.record_changes("export", step, changes, path)
  for line in changes.lines():
    print(f"  changed: {line}")
  # The last line, on stdout with the changes: the export's result.
  print(f"recsys export: exported step {step} of {args.model_dir} to {path}.")
  return 0
