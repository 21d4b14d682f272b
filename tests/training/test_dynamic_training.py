"""Dynamic-vocabulary tables under the Trainer, on a drifting id stream.

`SyntheticCTR.drift_every` makes two features deliver raw 64-bit ids from
a window that moves on; their tables are dynamic with a capacity below the
stream's distinct ids, so the runs below admit, evict and reset rows. What
holds for static tables must hold here too: 2 replicas train the one-
replica model (the indices see the global batch in one order), a compiled
step trains the uncompiled one (the mapping runs before it), and a run
stopped and resumed ends where an uninterrupted one does, bit for bit,
index included. Its export serves raw ids in plain TF: exported from the
trained backend's indices, and restored on the lookup-only export backend
as `recsys export` does (the tables and, from the same checkpoint, each
index), served in a process that cannot import the project, admitted ids
score as the trained model scores them and unknown ids as the default.
"""

import dataclasses
import functools

import numpy as np
import pytest
import tensorflow as tf

from backends.tensorcore.composed import ComposedEmbedding
from backends.vocabulary import DynamicVocabulary
from recsys.data.synthetic_ctr import SyntheticCTR
from recsys.features import EmbeddingSettings
from recsys.models import DLRM
from recsys.planning import EmbeddingPlacement, PlacementSettingsError
from recsys.run import evaluation
from recsys.run.restored import RestoredRun
from recsys.serving import export as export_lib
from recsys.train_settings import TrainSettings
from recsys.training import Trainer
from tests.backends import tf_v0_on_cpu
from tests.conftest import mirrored_strategy
from tests.training.few_steps import few_steps
from tests.training.test_trainer import assert_same_state, state

embedding = tf.tpu.experimental.embedding

MODEL = functools.partial(DLRM, bottom_mlp=(11, 7), top_mlp=(11,))
POLICY = DynamicVocabulary(eviction="lfu", admit_after=2)
#: C2's index in shards (`backends.vocabulary.sharded`): every run below
#: covers a sharded and a whole index.
SHARDED = DynamicVocabulary(eviction="lfu", admit_after=2, shards=3)


def _source() -> SyntheticCTR:
  """C1 drifts fast (a new id every 3 examples, window 20), C2 (bags of up
  to 3) every 5 over a window of 30; C3 is a plain static table."""
  return SyntheticCTR(
    num_dense=2,
    vocab_sizes=(20, 30, 10),
    multi_hot_sizes=(1, 3, 1),
    drift_every=(3, 5, 0),
    num_examples=400,
    num_eval_examples=40,
    oracle_examples=1024,
    seed=4,
  )


def _trainer(model_dir, strategy=None, vocabularies=None, **settings):
  vocabularies = vocabularies or {"C1": POLICY, "C2": SHARDED}
  return Trainer(
    str(model_dir),
    _source(),
    MODEL,
    strategy=strategy,
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=embedding.Adagrad(0.1),
    placement=EmbeddingPlacement(vocabularies=vocabularies),
    **few_steps(
      **{
        **dict(
          global_batch_size=20, train_steps=12, steps_per_loop=4, eval_steps=2
        ),
        "seed": 3,
        **settings,
      }
    ),
  )


def _index_state(run) -> dict[str, np.ndarray]:
  out = {}
  for table, index in run.backend.dynamic_tables().items():
    keys, rows = index.mapping()
    out[f"keys/{table}"] = keys.numpy()
    out[f"rows/{table}"] = rows.numpy()
    for name, value in index.counters().items():
      out[f"{name}/{table}"] = np.asarray(value.numpy())
  return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
  """One replica, uncompiled, 12 steps at once: the run the others are
  compared with (its trainer and final metrics)."""
  trainer = _trainer(tmp_path_factory.mktemp("plain"))
  return trainer, trainer.train()


def _assert_same_run(got, want, **tol):
  """The same indices (ids, rows, counters) and the same trained state."""
  assert _index_state(got).keys() == _index_state(want).keys()
  for key, value in _index_state(want).items():
    np.testing.assert_array_equal(_index_state(got)[key], value, err_msg=key)
  assert_same_state(state(got), state(want), **tol)


def test_the_tables_admit_evict_and_report_their_counters(plain):
  """The capacity is below the stream's ids: rows are reused, and the
  counters reach the run's results."""
  _, metrics = plain
  for table, capacity in (("C1", 20), ("C2", 30)):
    assert metrics[f"vocabulary/{table}/capacity"] == capacity
    assert metrics[f"vocabulary/{table}/rows_in_use"] <= capacity
    assert metrics[f"vocabulary/{table}/evictions"] > 0, metrics
    assert metrics[f"vocabulary/{table}/refused"] > 0, metrics  # admit_after 2
  assert "vocabulary/C3/capacity" not in metrics  # static
  assert np.isfinite(metrics["eval/auc"])


def test_two_replicas_train_the_one_replica_model_and_restore_into_one(
  plain, tmp_path, monkeypatch
):
  """8 steps on 2 replicas, then resumed on 1 to step 12, == 12 steps on
  1 replica: the indices see the global batch in one order, and being one
  copy per process (not split by replica), a checkpoint moves between
  replica counts. Training and evaluation map every batch outside the
  replica step (`strategy.run`), on the host: where a TPUStrategy can run
  the indices' hash tables."""
  strategy = mirrored_strategy(2)
  where = []
  map_ids = ComposedEmbedding.map_ids

  def spy(self, features, training=False):
    ctx = tf.distribute.get_replica_context()
    where.append((training, ctx is not None and ctx.strategy is strategy))
    return map_ids(self, features, training)

  monkeypatch.setattr(ComposedEmbedding, "map_ids", spy)
  _trainer(tmp_path, strategy=strategy, train_steps=8).train()
  assert set(where) == {(True, False), (False, False)}, where
  monkeypatch.undo()
  resumed = _trainer(tmp_path, strategy=mirrored_strategy(1))
  resumed.train()
  _assert_same_run(resumed.run, plain[0].run, rtol=2e-5, atol=1e-6)


def test_a_compiled_step_trains_the_uncompiled_model(plain, tmp_path):
  compiled = _trainer(tmp_path, jit_compile=True)
  compiled.train()
  _assert_same_run(compiled.run, plain[0].run, rtol=1e-5, atol=1e-6)


def test_a_stopped_run_resumes_bit_identical(plain, tmp_path):
  """Stopped after 8 steps and resumed to 12 == 12 steps at once: tables,
  slots, dense weights and every index (ids, rows, counters)."""
  _trainer(tmp_path, train_steps=8).train()
  resumed = _trainer(tmp_path)
  resumed.train()
  assert int(resumed.run.global_step.numpy()) == 12
  _assert_same_run(resumed.run, plain[0].run)


def test_tf_v0_trains_under_the_trainer_and_its_checkpoint_moves_to_tensorcore(
  plain, tmp_path, monkeypatch
):
  """tpu_embedding_v0 (TF's V0 itself, on CPU: tests/backends/
  tf_v0_on_cpu.py) under the Trainer: each batch mapped on the host before
  the replica step, its indices decide as tensorcore's do (ids, rows and
  counters equal the plain run's; the tables differ, TF's V0 drawing its
  own initial values), and its checkpoint, restored into tensorcore,
  evaluates to what the run itself evaluated."""
  tf_v0_on_cpu.allow(monkeypatch)
  trainer = _trainer(tmp_path, backend="tpu_embedding_v0")
  metrics = trainer.train()
  assert trainer.run.backend_name == "tpu_embedding_v0"
  got, want = _index_state(trainer.run), _index_state(plain[0].run)
  assert got.keys() == want.keys()
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  assert metrics["vocabulary/C1/evictions"] > 0
  moved = RestoredRun(
    trainer.run.model_dir,
    _source(),
    MODEL,
    settings=dataclasses.replace(trainer.run.settings, backend="tensorcore"),
  )
  assert moved.backend_name == "tensorcore"
  results, _ = evaluation.evaluate_restored(moved)
  for key in ("eval/auc", "eval/loss"):
    np.testing.assert_allclose(results[key], metrics[key], rtol=1e-6)


def test_raw_ids_into_a_table_that_takes_rows_are_refused(tmp_path):
  """C2's raw ids would be refused as out of range at the first step (or,
  below its size by chance, read unrelated rows): refused before any table,
  naming the feature and both ways to map it."""
  with pytest.raises(PlacementSettingsError, match=r"\['C2'\].*HashedIds"):
    _trainer(tmp_path, vocabularies={"C1": POLICY})


def test_the_export_maps_raw_ids_as_the_trained_index_does(
  plain, tmp_path, serving_process
):
  """Both exports (from the trained backend's indices, and from the
  checkpoint's through the lookup-only export backend) score admitted ids
  as the trained model does and unknown ids as its default (zeros)."""
  run = plain[0].run
  source = run.source
  features, _ = next(iter(source.dataset(16, training=False)))
  admitted, _ = run.backend.dynamic_tables()["C1"].mapping()
  assert int(tf.size(admitted)) >= 8
  categorical = dict(features["categorical"])
  # Rows 0-7: C1 ids the index holds; 8-15: ids it never saw.
  categorical["C1"] = tf.concat(
    [admitted[:8], tf.constant([12345 + i for i in range(8)], tf.int64)], 0
  )
  features = {**features, "categorical": categorical}
  names = list(run.backend.feature_config)
  mapped = run.backend.map_ids(
    {n: categorical[n] for n in names}, training=False
  )
  assert np.all(mapped["C1"].numpy()[8:] < 0)  # unknown: left out
  acts = run.backend.lookup(mapped, training=False)
  want = run.model(acts, features, training=False).numpy().reshape(-1)

  inputs = {"dense": features["dense"].numpy()}
  for name in names:
    ids = categorical[name]
    if isinstance(ids, tf.RaggedTensor):
      ids = ids.to_tensor(default_value=-1)
    inputs[name] = ids.numpy().astype(np.int64)

  export_lib.export(run, str(tmp_path / "from_backend"))

  restored = RestoredRun(
    run.model_dir,
    _source(),
    MODEL,
    settings=TrainSettings(
      embedding=EmbeddingSettings(dim=7),
      embedding_optimizer=tf.tpu.experimental.embedding.Adagrad(0.1),
      placement=run.settings.placement,
      backend="serving",
      global_batch_size=20,
      seed=3,
      progress_bar=False,
      summaries=False,
    ),
  )
  assert not restored.backend.dynamic_tables()  # the lookup-only backend
  export_lib.export(restored, str(tmp_path / "from_checkpoint"))
  # Served by TensorFlow alone (the session's serving process).
  for export in ("from_backend", "from_checkpoint"):
    got = serving_process.serve(
      tmp_path, str(tmp_path / export), {"s": ("serving_default", inputs)}
    )["s"]["scores"]
    np.testing.assert_allclose(
      got.reshape(-1), want, rtol=1e-5, atol=1e-6, err_msg=export
    )
