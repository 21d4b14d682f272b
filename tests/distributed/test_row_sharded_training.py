"""The Trainer, `recsys train` and Keras `fit` with row-sharded tables.

References: the same run on one replica with replicated tables and the same
global batches (tables, slots, dense weights, the dense optimizer's state);
a parameter-server run's checkpoint resumed replicated; Keras `fit` against the
backend's own loop on one replica (`tests.layers.test_embedding_layer`).
"""

import os
import re

import gin as gin_lib
import numpy as np
import pytest
import tensorflow as tf

from recsys import cli, layers, planning
from recsys._keras import keras
from tests.backends.test_compiled_path import assert_close
from tests.conftest import mirrored_strategy
from tests.layers import test_embedding_layer as layer_case
from tests.training import test_trainer
from tests.training.test_trainer import state

E = tf.tpu.experimental.embedding
#: A device whose budget (HEADROOM x memory) holds the two tables (23 x 7,
#: Adagrad: one slot) row-sharded over 2 replicas (12 rows each), not
#: replicated (1.9x the budget).
BUDGET = planning.EmbeddingPlacement(
  device_memory=int(2 * 12 * 7 * 4 * 2 / planning.HEADROOM)
)


def make(model_dir, strategy=None, placement=None, steps=6):
  return test_trainer.make_trainer(
    model_dir,
    strategy,
    train_steps=steps,
    global_batch_size=12,
    steps_per_loop=3,
    eval_steps=2,
    summaries=False,
    placement=placement,
  )


def assert_same(want, got):
  assert_close(want, got, tol=1e-5)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
  """The run on one replica, tables replicated: its final state."""
  trainer = make(tmp_path_factory.mktemp("one"))
  trainer.train()
  return state(trainer.run)


# On 2 replicas: `recsys train` below runs the planner's choice on 4.
@pytest.mark.slow
def test_planner_shards_tables_over_the_budget_same_numbers(
  replicated, tmp_path
):
  trainer = make(tmp_path, mirrored_strategy(2), BUDGET)
  assert trainer.backend.placements() == {
    "user": "row_sharded",
    "tags": "row_sharded",
  }
  trainer.train()
  assert_same(replicated, state(trainer.run))

  # The checkpoint resumes on one replica, replicated (no placement).
  resumed = make(tmp_path, steps=6)
  assert resumed.run.restored_step == 6
  assert set(resumed.backend.placements().values()) == {"replicated"}
  assert_same(replicated, state(resumed.run))


def test_one_replica_refuses_what_only_fits_sharded(tmp_path):
  with pytest.raises(planning.MemoryPlanError, match="tables need 2.5 KiB"):
    make(tmp_path, placement=BUDGET)


def test_keras_fit_on_row_sharded_tables_equals_the_loop_on_one_replica():
  config = layer_case.feature_config()
  tables, dense_values = layer_case.initial_values(config)
  x, y = layer_case.data()
  strategy = mirrored_strategy(2)
  with strategy.scope():
    emb = layers.Embedding(
      config,
      E.Adagrad(0.1),
      placement=planning.EmbeddingPlacement(tables="row_sharded"),
    )
    model = layer_case.ranking_model(emb)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  assert set(emb.embedding.placements().values()) == {"row_sharded"}
  layer_case.set_values(
    emb.embedding_tables, model.layers[-1], tables, dense_values
  )
  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(layer_case.BATCH)
  model.fit(ds, epochs=1, verbose=0, shuffle=False)
  ref_emb, ref_dense = layer_case.hand_loop(
    config, tables, dense_values, x, y, 0.05
  )
  want = {t.name: v.numpy() for t, v in ref_emb.embedding_tables.items()}
  for table, var in emb.embedding_tables.items():
    np.testing.assert_allclose(
      var.numpy(), want[table.name], rtol=1e-5, atol=1e-6
    )
  for got, ref in zip(model.layers[-1].get_weights(), ref_dense.get_weights()):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_recsys_train_prints_the_plan_and_trains_sharded(
  tmp_path, capsys, caplog
):
  """`recsys train` on 4 CPU replicas (`recsys.cli.main`, in this process:
  its 4 logical CPUs): the planner row-shards the DLRM's tables (twice a
  device's budget), logs the plan, and the checkpoint equals the 1-replica
  replicated run's on the same global batches."""
  gin = tmp_path / "small.gin"
  gin.write_text(
    "include 'synthetic_dlrm.gin'\n"
    "SyntheticCTR.vocab_sizes = (40, 24)\n"
    "SyntheticCTR.multi_hot_sizes = (1, 3)\n"
    "SyntheticCTR.num_examples = 96\n"
    "SyntheticCTR.num_eval_examples = 48\n"
    "SyntheticCTR.oracle_examples = 4096\n"  # the Bayes AUC: unread
    "EmbeddingSettings.dim = 4\n"
    "DLRM.bottom_mlp = (8, 4)\n"
    "DLRM.top_mlp = (8,)\n"
    "train.global_batch_size = 16\n"
    "train.train_steps = 4\n"
    "train.steps_per_loop = 2\n"
    "train.eval_steps = 1\n"
    "train.progress_bar = False\n"
    "train.summaries = False\n"
  )
  # Adam: table + 2 slots; the tables are 64 rows x 4 x 4 bytes x 3.
  budget_memory = int(64 * 4 * 4 * 3 / 2 / planning.HEADROOM)
  one, four = str(tmp_path / "one"), str(tmp_path / "four")
  with caplog.at_level("INFO"):
    code = cli.main(
      ["train", "--gin_file", str(gin), "--model_dir", four]
      + ["--gin_bindings=train.num_cpu_replicas = 4"]
      + ["--gin_bindings=train.placement = @EmbeddingPlacement()"]
      + [f"--gin_bindings=EmbeddingPlacement.device_memory = {budget_memory}"]
    )
  assert code == 0
  assert re.search(r"\bC1\b.*row_sharded /4", caplog.text), caplog.text
  # The same gin on one replica, tables replicated; then the 4-replica
  # checkpoint exported through the `serving` backend (TF's
  # TPUEmbeddingForServing) on one device.
  gin_lib.clear_config()  # as a new `recsys train` process starts
  assert cli.main(["train", "--gin_file", str(gin), "--model_dir", one]) == 0
  # The run's own operative config: its device budget (train.placement)
  # is the training devices', not the exporting host's.
  gin_lib.clear_config()  # as a new `recsys export` process starts
  capsys.readouterr()
  export = ["export", "--model_dir", four]
  assert cli.main(export + ["--export_dir", str(tmp_path / "export")]) == 0
  assert "exported step 4" in capsys.readouterr().out
  one_ckpt = tf.train.load_checkpoint(os.path.join(one, "checkpoints"))
  four_ckpt = tf.train.load_checkpoint(os.path.join(four, "checkpoints"))
  keys = [
    k
    for k in one_ckpt.get_variable_to_shape_map()
    if k.startswith("embedding/") and "ATTRIBUTES" in k
  ]
  assert len(keys) == 2 * 3  # 2 tables and their Adam slots
  for key in keys:
    np.testing.assert_allclose(
      four_ckpt.get_tensor(key), one_ckpt.get_tensor(key), rtol=1e-5, atol=1e-6
    )


@pytest.mark.slow
def test_a_row_sharded_run_with_dynamic_tables_survives_sigkill(
  tmp_path, monkeypatch
):
  """Killed (SIGKILL mid-step), resumed: the same final state, the
  dynamic tables' indices and step clock included (ids admitted, refused
  and reset across the kill), as one uninterrupted run (here, in this
  process), as replicated runs are (`tests.reliability.test_crash_resume`,
  which also covers SIGTERM: its save is the same checkpoint write as
  every step's)."""
  from tests.reliability import test_crash_resume as crash  # pylint: disable=g-import-not-at-top
  from tests.reliability import train_worker as worker  # pylint: disable=g-import-not-at-top

  steps = 6
  monkeypatch.setenv("RECSYS_TEST_ROW_SHARDED", "2")
  monkeypatch.setenv("RECSYS_TEST_DYNAMIC", "1")
  monkeypatch.setattr(crash, "STEPS", steps)
  model_dir, out = tmp_path / "model", tmp_path / "final.npz"
  first = crash.Worker(model_dir, out)
  assert first.expect("resumed") == 0
  first.expect("step")
  seen = first.expect("step")
  first.kill()  # SIGKILL, possibly inside a checkpoint write
  first.wait()
  assert crash.latest_checkpoint_step(model_dir) >= seen - 1
  last = crash.Worker(model_dir, out)
  assert last.expect("resumed") == crash.latest_checkpoint_step(model_dir)
  assert last.wait() == 0

  # The worker's run (`tests.reliability.train_worker`), uninterrupted.
  whole = worker.make_trainer(
    tmp_path / "whole",
    steps,
    strategy=mirrored_strategy(2),
    placement=planning.EmbeddingPlacement(
      tables=worker.ROW_SHARDED, vocabularies=worker.dynamic()
    ),
  )
  whole.train()
  final = np.load(out)
  want = state(whole.run)
  assert sorted(final.files) == sorted(want)
  counters = {k: int(v) for k, v in want.items() if "admissions" in k}
  assert min(counters.values()) > 0, counters
  for key, value in want.items():
    np.testing.assert_allclose(final[key], value, rtol=1e-6, atol=1e-7)
