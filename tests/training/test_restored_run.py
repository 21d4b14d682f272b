"""A restored run: a trained run's objects read back without a loop.

What `recsys evaluate` and `recsys export` use: it must hold the trained
state the Trainer saved (tables, slots, dense weights, optimizer), score
the model exactly as the Trainer's final evaluation did, and refuse what
the Trainer refuses.
"""

import importlib

import numpy as np
import pytest
import tensorflow as tf

from recsys.features import EmbeddingSettings
from recsys.run import evaluation
from recsys.run.restored import RestoredRun
from recsys.train_settings import TrainerConfigError, TrainSettings
from recsys.training import Trainer, train
from tests.training.few_steps import few_steps
from tests.training.sources import ArraySource
from tests.training.test_trainer import MODEL, assert_same_state, state

SETTINGS = few_steps(train_steps=8, steps_per_loop=4, eval_steps=None, seed=3)


def _settings(**changes):
  values = dict(SETTINGS, embedding=EmbeddingSettings(dim=7))
  values.update(changes)
  return TrainSettings(**values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A run trained 8 steps: (model dir, its final metrics, its state)."""
  model_dir = str(tmp_path_factory.mktemp("run"))
  trainer = Trainer(
    model_dir,
    ArraySource(),
    MODEL,
    embedding_optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
    embedding=EmbeddingSettings(dim=7),
    **SETTINGS,
  )
  metrics = trainer.train()
  return model_dir, metrics, state(trainer.run)


def _restored(model_dir, **changes):
  return RestoredRun(
    model_dir,
    ArraySource(),
    MODEL,
    settings=_settings(
      embedding_optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
      **changes,
    ),
  )


def test_a_restored_run_holds_the_trained_state_and_scores_it_alike(trained):
  model_dir, metrics, trained_state = trained
  run = _restored(model_dir)
  assert run.restored_step == 8
  assert_same_state(state(run), trained_state)
  got = evaluation.Evaluator(run).evaluate()
  for name in ("eval/auc", "eval/loss", "eval/examples"):
    np.testing.assert_allclose(got[name], metrics[name], rtol=1e-6)
  assert got["eval/examples"] == 240


def test_evaluate_restored_needs_a_checkpoint(tmp_path):
  run = _restored(str(tmp_path))
  assert run.restored_step == 0
  with pytest.raises(FileNotFoundError, match="no checkpoint in .* evaluate"):
    evaluation.evaluate_restored(run)


def test_exclude_seen_is_refused_for_a_ranking_run(trained):
  with pytest.raises(TrainerConfigError, match="applies to retrieval models"):
    _restored(trained[0], exclude_seen=True)


def test_train_restore_builds_no_trainer(trained, monkeypatch):
  """`train(action="restore")`, what `recsys evaluate` and `export` call,
  returns the restored run and never constructs a Trainer."""
  train_lib = importlib.import_module("recsys.training.train")

  def no_trainer(*args, **kwargs):
    raise AssertionError("train(action='restore') built a Trainer")

  monkeypatch.setattr(train_lib, "Trainer", no_trainer)
  run = train(
    trained[0],
    data=ArraySource(),
    model=MODEL,
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
    action="restore",
    **SETTINGS,
  )
  assert isinstance(run, RestoredRun) and run.restored_step == 8


def test_the_trainer_takes_settings_or_keywords_not_both(tmp_path):
  with pytest.raises(TypeError, match=r"\(seed\), not both"):
    Trainer(str(tmp_path), ArraySource(), MODEL, settings=_settings(), seed=1)
