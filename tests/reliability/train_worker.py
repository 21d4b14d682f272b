"""A small training run for the fault-injection tests (run as a script).

Usage: python -m tests.reliability.train_worker MODEL_DIR OUT.npz STEPS [POLICY]

Trains the trainer tests' tiny DLRM with a checkpoint after every step (so a
kill often lands inside a checkpoint write), prints `resumed <step>` once
built and `step <n>` after each step, and saves every variable a step changes
to OUT.npz when training completes. Exit status: 0 done, 143 stopped by
SIGTERM after saving (what `recsys train` returns). With
RECSYS_TEST_ROW_SHARDED=R in the environment it trains on R logical CPU
replicas with every table row-sharded over them; with RECSYS_TEST_DYNAMIC=1,
its tables take raw ids through dynamic vocabularies (`DYNAMIC`).
"""

import logging
import os
import sys

import numpy as np
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys.training import signals
from tests.training import test_trainer


class _PrintSteps(logging.Handler):
  def emit(self, record):
    message = record.getMessage()
    if message.startswith("step "):
      print(message.split("/")[0], flush=True)


#: The tables RECSYS_TEST_ROW_SHARDED row-shards: all of them.
ROW_SHARDED = {"user": "row_sharded", "tags": "row_sharded"}


def dynamic() -> dict:
  """RECSYS_TEST_DYNAMIC's vocabularies: "user" admitted at a second
  sighting (first ones read zeros), "tags" (multi-hot, padded) at the
  first, least recently used evicted."""
  from backends.vocabulary import DynamicVocabulary  # pylint: disable=g-import-not-at-top

  return {
    "user": DynamicVocabulary(admit_after=2),
    "tags": DynamicVocabulary(eviction="lru"),
  }


def _row_sharded() -> dict:
  """The strategy and placement of RECSYS_TEST_ROW_SHARDED and
  RECSYS_TEST_DYNAMIC (or nothing)."""
  replicas = int(os.environ.get("RECSYS_TEST_ROW_SHARDED", "0"))
  vocabularies = dynamic() if os.environ.get("RECSYS_TEST_DYNAMIC") else {}
  if replicas < 2 and not vocabularies:
    return {}
  from recsys import planning  # pylint: disable=g-import-not-at-top
  from recsys.run import strategy as strategy_lib  # pylint: disable=g-import-not-at-top

  options = {}
  if replicas >= 2:
    options["strategy"] = strategy_lib.make_strategy(num_cpu_replicas=replicas)[
      0
    ]
  options["placement"] = planning.EmbeddingPlacement(
    tables=ROW_SHARDED if replicas >= 2 else {}, vocabularies=vocabularies
  )
  return options


def make_trainer(model_dir: str, steps: int, **options):
  """The worker's trainer: a checkpoint after every step, `options` added."""
  return test_trainer.make_trainer(
    model_dir,
    **options,
    train_steps=steps,
    steps_per_loop=1,
    checkpoint_every=1,
    max_checkpoints=2,
    summaries=False,
    eval_steps=1,
  )


def main(model_dir: str, out_path: str, steps: int) -> int:
  tf.config.experimental.enable_op_determinism()
  logging.getLogger("recsys.training").addHandler(_PrintSteps())
  logging.getLogger("recsys.training").setLevel(logging.INFO)
  trainer = make_trainer(model_dir, steps, **_row_sharded())
  print(f"resumed {trainer.run.restored_step}", flush=True)
  try:
    trainer.train()
  except signals.TrainingPreempted as e:
    print(f"preempted {e.step}", flush=True)
    return e.exit_status
  np.savez(out_path, **test_trainer.state(trainer.run))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
