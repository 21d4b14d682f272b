"""`train.jit_compile`: each model's replica step compiled with XLA, as on TPU.

Reference: the same run uncompiled (tables, slots, dense weights and the
dense optimizer's state), and an HLO without dynamic dimensions. A two-tower
run asked to compile on 2 replicas (the static path, whose ragged bags lose
the batch size) is `tests/models/test_two_tower_replicas.py`'s mixed case,
checked against one replica.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import SyntheticRetrieval
from recsys.features import EmbeddingSettings
from recsys.models import DLRM, DCNv2, TwoTower
from recsys.run import compile as compile_lib
from recsys.training import Trainer
from tests.conftest import mirrored_strategy
from tests.training.few_steps import few_steps
from tests.training.sources import ArraySource
from tests.training.test_trainer import state

E = tf.tpu.experimental.embedding

# Every model, and every embedding optimizer on some table of one of them
# (a default plus a per-table override each).
CASES = {
  "dlrm_adagrad_sgd": (
    ArraySource,
    functools.partial(DLRM, bottom_mlp=(11, 7), top_mlp=(11,)),
    lambda: E.Adagrad(0.1),
    {"user": lambda: E.SGD(0.1)},
  ),
  "dcn_ftrl_momentum": (
    ArraySource,
    functools.partial(DCNv2, num_cross_layers=2, deep_mlp=(11,)),
    lambda: E.FTRL(0.1),
    {"user": lambda: E.AdagradMomentum(0.1, momentum=0.5)},
  ),
  "two_tower_adam_dense_adam": (
    lambda: SyntheticRetrieval(
      num_users=23, num_items=11, num_examples=240, num_eval_examples=40
    ),
    functools.partial(
      TwoTower,
      query_tower=(11, 7),
      candidate_tower=(11, 7),
      logq_correction=1.25,  # a strength: tf.pow in the compiled step
    ),
    lambda: E.Adam(0.01),
    {"item_id": lambda: E.Adam(0.01, lazy_adam=False)},
  ),
}


def make(tmp_path, case, jit_compile, strategy=None, steps=6):
  source, model, optimizer, overrides = CASES[case]
  overrides = {table: {"optimizer": opt()} for table, opt in overrides.items()}
  return Trainer(
    str(tmp_path),
    source(),
    model,
    strategy=strategy,
    embedding=EmbeddingSettings(dim=7, overrides=overrides),
    embedding_optimizer=optimizer(),
    **few_steps(
      train_steps=steps,
      steps_per_loop=3,
      eval_steps=2,
      seed=3,
      jit_compile=jit_compile,
    ),
  )


def assert_same_values(want, got):
  """Same variables in the same order (Keras numbers layer names per model)."""
  assert len(want) == len(got)
  for (key, a), b in zip(want.items(), got.values()):
    scale = max(1.0, float(np.abs(a).max()))
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * scale, err_msg=key)


@pytest.fixture(scope="module")
def compiled_states():
  """Final states of compiled runs on one replica, by case: the 2-replica
  test compares with the one its case's test trained (XLA compiling is most
  of either run's cost)."""
  return {}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_trainer_step_equals_uncompiled(
  tmp_path, case, compiled_states
):
  want = make(tmp_path / "plain", case, False)
  want.train()
  got = make(tmp_path / "xla", case, True)
  assert got.steps.jit_compile
  metrics = got.train()
  assert np.isfinite(metrics["eval/loss"])
  compiled_states[case] = state(got.run)
  assert_same_values(state(want.run), state(got.run))
  # The compiled replica step has only static shapes.
  batch = next(iter(got.run.distribute(got.run.source, 10, training=True)))
  hlo = got.steps._replica_train_step.experimental_get_compiler_ir(batch)(  # pylint: disable=protected-access
    stage="hlo"
  )
  assert "<=" not in hlo


@pytest.mark.slow
def test_compiled_two_replicas_equal_one(tmp_path, compiled_states):
  """2 CPU replicas asked to compile run the static path: same numbers."""
  if "dlrm_adagrad_sgd" not in compiled_states:  # run alone (-k)
    one = make(tmp_path / "one", "dlrm_adagrad_sgd", True)
    one.train()
    compiled_states["dlrm_adagrad_sgd"] = state(one.run)
  two = make(
    tmp_path / "two", "dlrm_adagrad_sgd", True, strategy=mirrored_strategy(2)
  )
  assert (
    two.run.compile_plan.static_shapes
    and not two.run.compile_plan.compile_steps
  )
  two.train()
  assert_same_values(compiled_states["dlrm_adagrad_sgd"], state(two.run))


def test_plan_by_strategy():
  default = tf.distribute.get_strategy()
  assert compile_lib.plan(default, None) == compile_lib.CompilePlan(
    False, False, "not asked for (train.jit_compile)"
  )
  assert compile_lib.plan(default, True).compile_steps
  two = compile_lib.plan(mirrored_strategy(2), True)
  assert (two.compile_steps, two.static_shapes) == (False, True)
  assert "XLA cannot compile CPU collectives" in two.reason
