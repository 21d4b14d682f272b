"""Trainer: files it writes, resume at the exact step, seeds, replicas."""

import dataclasses
import functools
import importlib
import inspect
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from recsys import ranges
from recsys import train_settings as settings_lib
from recsys.features import EmbeddingSettings
from recsys.model_dir import run_configs
from recsys.models import DLRM
from recsys.planning import EmbeddingPlacement
from recsys.run import schedules
from recsys.run.configured import configured_run
from recsys.train_settings import TrainSettings
from recsys.training import Trainer, TrainerConfigError, train
from tests.conftest import mirrored_strategy
from tests.training.sources import ArraySource

embedding = tf.tpu.experimental.embedding

MODEL = functools.partial(DLRM, bottom_mlp=(11, 7), top_mlp=(11,))


def make_trainer(
  model_dir, strategy=None, train_steps=12, optimizer=None, **kwargs
):
  settings = dict(
    global_batch_size=10,
    train_steps=train_steps,
    steps_per_loop=4,
    eval_steps=None,
    progress_bar=False,
    seed=3,
  )
  settings.update(kwargs)
  return Trainer(
    str(model_dir),
    ArraySource(),
    MODEL,
    strategy=strategy,
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=optimizer or embedding.Adagrad(0.1),
    **settings,
  )


def state(run):
  """Every variable a step changes: tables, slots, dense weights, opt slots
  (of a `RestoredRun`: a Trainer's is `trainer.run`)."""
  out = {}
  for table, var in run.backend.embedding_tables.items():
    out[f"table/{table.name}"] = var.numpy()
  for table, slots in run.backend.slot_variables().items():
    for name, var in slots.items():
      out[f"slot/{table}/{name}"] = var.numpy()
  for var in run.model.trainable_variables:
    out[f"dense/{var.name}"] = var.numpy()
  for i, var in enumerate(run.dense_optimizer.variables):
    out[f"opt/{i}"] = np.asarray(var.numpy())
  for table, index in run.backend.dynamic_tables().items():
    keys, rows = index.mapping()
    out[f"index/{table}/mapping"] = np.stack([keys.numpy(), rows.numpy()])
    for name, value in index.counters().items():
      out[f"index/{table}/{name}"] = value.numpy()
    for name in ("counts", "last_seen", "sketch_cells"):
      out[f"index/{table}/{name}"] = getattr(index, name).numpy()
  return out


def assert_same_state(a, b, **tol):
  assert sorted(a) == sorted(b)
  for key in a:
    if tol:
      np.testing.assert_allclose(a[key], b[key], err_msg=key, **tol)
    else:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_train_writes_run_files(tmp_path):
  trainer = make_trainer(tmp_path, train_steps=8)
  metrics = trainer.train()
  assert metrics["step"] == 8
  assert int(trainer.run.global_step.numpy()) == 8
  for key in (
    "train/loss",
    "eval/loss",
    "eval/auc",
    "examples_per_second_steady",
    "examples_per_second_whole_run",
  ):
    assert np.isfinite(metrics[key]), key
  on_disk = json.loads((tmp_path / "metrics.json").read_text())
  assert on_disk["step"] == 8 and on_disk["backend"] == "tensorcore"
  assert (tmp_path / "operative_config.gin").exists()
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith(
    "-8"
  )
  assert os.listdir(tmp_path / "train") and os.listdir(tmp_path / "eval")


def test_eval_loss_matches_numpy_bce_of_predictions(tmp_path):
  """eval/loss is the mean BCE over the eval split (a NumPy reference)."""
  trainer = make_trainer(tmp_path, train_steps=4)
  trainer.train()
  logits, labels = [], []
  for features, y in trainer.run.source.dataset(10, training=False):
    acts = trainer.backend.lookup(
      {n: features["categorical"][n] for n in ("user", "tags")},
      {"user": None, "tags": features["weights"]["tags"]},
    )
    logits.append(trainer.model.logits(acts, features).numpy())
    labels.append(y.numpy())
  z, y = np.concatenate(logits), np.concatenate(labels)
  bce = np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))
  np.testing.assert_allclose(trainer.evaluate()["eval/loss"], bce, rtol=1e-5)


@pytest.mark.slow
def test_kill_and_resume_continues_at_saved_step(tmp_path):
  """Stop after 8 steps, restart on the same dir: same end state as 16 steps."""
  whole = make_trainer(tmp_path / "whole", train_steps=16)
  whole.train()
  first = make_trainer(tmp_path / "split", train_steps=8)
  first.train()
  saved = state(first.run)
  del first  # the "kill"
  resumed = make_trainer(tmp_path / "split", train_steps=16)
  assert resumed.run.restored_step == 8
  assert int(resumed.run.global_step.numpy()) == 8
  # Restored tables, optimizer slots and dense weights are exactly as saved.
  assert_same_state(state(resumed.run), saved)
  resumed.train()
  assert int(resumed.run.global_step.numpy()) == 16
  # ... and the data continued where it stopped: as the run that never did.
  assert_same_state(state(resumed.run), state(whole.run), rtol=1e-6, atol=1e-7)


def test_same_seed_same_metrics(tmp_path):
  a = make_trainer(tmp_path / "a").train()
  b = make_trainer(tmp_path / "b").train()
  for key in a:
    if key.startswith(("train/", "eval/")):
      assert a[key] == b[key], key


@pytest.mark.slow
def test_two_replicas_match_one_on_the_same_global_batch(tmp_path):
  """2 mirrored CPU replicas == 1 replica with the combined batch (state)."""
  trained = []
  for replicas in (1, 2):  # each built and trained in turn
    trainer = make_trainer(
      tmp_path / f"replicas_{replicas}",
      strategy=mirrored_strategy(replicas),
      train_steps=8,
      optimizer=embedding.Adam(0.01),
    )
    trainer.train()
    trained.append(trainer)
  one, two = trained
  assert two.run.strategy.num_replicas_in_sync == 2
  assert_same_state(state(one.run), state(two.run), rtol=2e-5, atol=1e-6)


def test_batch_not_divisible_by_replicas_is_refused(tmp_path):
  with pytest.raises(TrainerConfigError, match="multiple of the 2 replicas"):
    make_trainer(tmp_path, strategy=mirrored_strategy(2), global_batch_size=9)


def test_embedding_learning_rate_schedule_follows_the_step(tmp_path):
  """A Keras schedule as embedding lr is evaluated at the global step (SGD)."""
  schedule = schedules.WarmupPolyDecay(0.5, warmup_steps=4)
  opt = embedding.SGD(learning_rate=schedule)
  trainer = make_trainer(tmp_path, train_steps=4, optimizer=opt)
  bound = trainer.run.embedding_optimizer
  assert type(bound) is embedding.SGD and callable(bound.learning_rate)
  trainer.run.global_step.assign(1)
  np.testing.assert_allclose(float(bound.learning_rate()), 0.5 * 2 / 4)
  trainer.run.global_step.assign(10)
  np.testing.assert_allclose(float(bound.learning_rate()), 0.5)
  # The caller's optimizer is not rewritten (bound on a copy).
  assert opt.learning_rate is schedule


def test_warmup_poly_decay_matches_formula():
  lr = schedules.WarmupPolyDecay(
    2.0,
    warmup_steps=10,
    decay_start_step=20,
    decay_steps=30,
    power=2.0,
    end_factor=0.1,
  )
  for step in (0, 5, 9, 10, 19, 20, 35, 49, 50, 80):
    if step < 10:
      want = 2.0 * (step + 1) / 10
    elif step < 20:
      want = 2.0
    else:
      frac = min((step - 20) / 30, 1.0)
      want = 2.0 * max((1 - frac) ** 2, 0.1)
    np.testing.assert_allclose(float(lr(step)), want, rtol=1e-6, err_msg=step)


def test_train_parameters_are_the_settings_and_its_own_objects():
  """Every `TrainSettings` field is a `train.*` parameter, same default, and
  declares its kind; the lists derived from the declaration name only
  `train` parameters (a setting, or one of `train`'s own named there).
  Gin's `train` is `recsys.run.configured.configured_run`."""
  params = inspect.signature(configured_run).parameters
  fields = {f.name: f.default for f in dataclasses.fields(TrainSettings)}
  own = {"model_dir", "data", "model", "eval_data", "tpu", "num_cpu_replicas"}
  assert set(params) - own - {"strategy", "action"} == set(fields)
  for name, default in fields.items():
    assert params[name].default == default, name
  for field in dataclasses.fields(TrainSettings):
    assert field.metadata.get("kind") in settings_lib.KINDS, field.name
  execution = set(settings_lib.names_of_kind(settings_lib.EXECUTION))
  assert execution | set(settings_lib.names_of_kind(settings_lib.MATH)) == (
    set(fields)
  )
  # The resume check's list: the execution settings, and only `train`
  # arguments that are no setting besides (the action, the strategy's).
  train_names = {
    key.split(".", 1)[1]
    for key in run_configs.EXECUTION_SETTINGS
    if key.startswith("train.")
  }
  assert train_names & set(fields) == execution
  assert train_names - set(fields) == {"action", "tpu", "num_cpu_replicas"}
  assert train_names <= set(params)
  placement = {
    key.split(".", 1)[1]
    for key in run_configs.EXECUTION_SETTINGS
    if not key.startswith("train.")
  }
  assert placement == set(inspect.signature(EmbeddingPlacement).parameters)


def test_every_train_setting_reaches_the_trainer(monkeypatch, tmp_path):
  """What gin binds as `train.<setting>` is what the Trainer gets."""
  # The module, not the function `recsys.training.train` names.
  train_lib = importlib.import_module("recsys.training.train")
  got = {}

  class Recording:
    def __init__(self, model_dir, source, model, **kwargs):
      got.update(kwargs)

    def train(self):
      return {}

  monkeypatch.setattr(train_lib, "Trainer", Recording)
  # Sentinels, one per setting, which no declared range takes: the ranges
  # are tests/test_setting_ranges.py's; here, only where each value goes.
  monkeypatch.setattr(ranges, "check_all", lambda *args: None)
  values = {f.name: object() for f in dataclasses.fields(TrainSettings)}
  values["summaries"] = True  # train() ands it with action == "train"
  train(
    str(tmp_path),
    data=object(),
    model=object(),
    strategy=tf.distribute.get_strategy(),
    **values,
  )
  settings = got["settings"]
  for name, value in values.items():
    assert getattr(settings, name) is value, name


def test_model_factories_get_the_arguments_their_model_kind_declares():
  """gin wraps `@DLRM` in a (*args, **kwargs) subclass; the trainer passes
  the arguments DLRM's kind declares (not MovieLens' query_features)."""
  import gin

  from recsys.gin_config import compat as _gin_compat
  from recsys.models import DLRM, TwoTower, model_args
  from recsys.models.base import RankingModel
  from recsys.models.retrieval.model import RetrievalModel

  arguments = model_args.model_arguments
  gin.parse_config("import recsys.models\nx/macro.value = @DLRM")
  wrapped = _gin_compat.evaluate(gin.query_parameter("x/macro.value"))
  assert arguments(wrapped) == RankingModel.TRAINER_ARGUMENTS
  assert arguments(functools.partial(TwoTower, embedding_dim=4)) == (
    RetrievalModel.TRAINER_ARGUMENTS
  )
  assert arguments(DLRM) == ("feature_specs", "num_dense")
  assert "query_features" in RetrievalModel.TRAINER_ARGUMENTS
