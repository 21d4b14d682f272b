"""`recsys train`'s entry point: a configured run trained by the Trainer.

The gin settings (`train.*`) are `recsys.run.configured.configured_run`'s,
below this package, so `recsys evaluate` and `recsys export` restore a run
without loading the training loop. `train(...)` here takes the same
arguments, asks `configured_run` for the run (gin fills what the caller
does not pass) and does what `action` says with it (`act`).

Example:
  >>> config.parse(["experiments/synthetic_dlrm.gin"])
  >>> metrics = train(model_dir="runs/demo")
"""

from typing import Any

from recsys.run import evaluation
from recsys.run.configured import (
  ACTIONS,
  ConfiguredRun,
  configured_embedding,
  configured_plan,
  configured_run,
  configured_settings,
  configured_strategy,
)
from recsys.run.restored import RestoredRun
from recsys.training.trainer import Trainer

__all__ = [
  "ACTIONS",
  "act",
  "build_trainer",
  "configured_embedding",
  "configured_plan",
  "configured_settings",
  "configured_strategy",
  "train",
]


def train(
  model_dir: str, action: str = "train", **arguments: Any
) -> dict[str, float] | Trainer | RestoredRun:
  """Builds the configured run, then trains, evaluates or returns it.

  Args:
    model_dir: the run folder (see `configured_run`).
    action: "train" (returns final metrics), "evaluate" (restores the latest
      checkpoint, returns eval metrics), "restore" (returns the
      `RestoredRun`: no loop) or "build" (returns the Trainer).
    **arguments: `configured_run`'s, i.e. what gin binds as `train.<name>`
      (`data`, `model`, `strategy`, each `TrainSettings` field, ...); the
      ones not given come from the gin config.

  Raises:
    ValueError: unknown action, or inconsistent settings (see `Trainer`).
  """
  return act(configured_run(model_dir, action=action, **arguments), action)


def act(
  run: ConfiguredRun, action: str = "train"
) -> dict[str, float] | Trainer | RestoredRun:
  """What `action` (`ACTIONS`) does with a configured run."""
  if action in ("restore", "evaluate"):  # the run restored, no loop
    restored = run.restored()
    if action == "restore":
      return restored
    results, changes = evaluation.evaluate_restored(restored)
    if changes:
      restored.run_dir.record_changes(
        "evaluate", restored.restored_step, changes
      )
    return results
  trainer = build_trainer(run)
  return trainer if action == "build" else trainer.train()


def build_trainer(run: ConfiguredRun) -> Trainer:
  """The Trainer of a configured run: its restored run and the loop."""
  return Trainer(
    run.model_dir,
    run.source,
    run.model,
    strategy=run.strategy,
    eval_source=run.eval_source,
    settings=run.settings,
  )
