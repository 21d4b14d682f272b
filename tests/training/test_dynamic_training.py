"""Dynamic-vocabulary tables under the Trainer, on a drifting id stream.

`SyntheticCTR.drift_every` makes two features deliver raw 64-bit ids from
a window that moves on; their tables are dynamic with a capacity below the
stream's distinct ids, so the runs below admit, evict and reset rows. What
holds for static tables must hold here too: 2 replicas train the one-
replica model (the indices see the global batch in one order), a compiled
step trains the uncompiled one (the mapping runs before it), and a run
stopped and resumed ends where an uninterrupted one does, bit for bit,
index included.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from backends.vocabulary import DynamicVocabulary
from recsys.data.synthetic_ctr import SyntheticCTR
from recsys.features import EmbeddingSettings
from recsys.models import DLRM
from recsys.planning import EmbeddingPlacement, PlacementSettingsError
from recsys.training import Trainer
from tests.conftest import mirrored_strategy
from tests.training.test_trainer import assert_same_state, state

embedding = tf.tpu.experimental.embedding

MODEL = functools.partial(DLRM, bottom_mlp=(11, 7), top_mlp=(11,))
POLICY = DynamicVocabulary(eviction="lfu", admit_after=2)


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
  vocabularies = vocabularies or {"C1": POLICY, "C2": POLICY}
  return Trainer(
    str(model_dir),
    _source(),
    MODEL,
    strategy=strategy,
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=embedding.Adagrad(0.1),
    placement=EmbeddingPlacement(vocabularies=vocabularies),
    **{
      **dict(
        global_batch_size=20,
        train_steps=12,
        steps_per_loop=4,
        eval_steps=2,
        progress_bar=False,
        summaries=False,
        seed=3,
      ),
      **settings,
    },
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


def test_the_tables_admit_evict_and_report_their_counters(tmp_path):
  """The capacity is below the stream's ids: rows are reused, and the
  counters reach the run's results."""
  metrics = _trainer(tmp_path).train()
  for table, capacity in (("C1", 20), ("C2", 30)):
    assert metrics[f"vocabulary/{table}/capacity"] == capacity
    assert metrics[f"vocabulary/{table}/rows_in_use"] <= capacity
    assert metrics[f"vocabulary/{table}/evictions"] > 0, metrics
    assert metrics[f"vocabulary/{table}/refused"] > 0, metrics  # admit_after 2
  assert "vocabulary/C3/capacity" not in metrics  # static
  assert np.isfinite(metrics["eval/auc"])


def test_two_replicas_train_the_one_replica_model(tmp_path):
  trained = []
  for replicas in (1, 2):
    trainer = _trainer(
      tmp_path / f"r{replicas}", strategy=mirrored_strategy(replicas)
    )
    trainer.train()
    trained.append(trainer.run)
  one, two = trained
  assert _index_state(one).keys() == _index_state(two).keys()
  for key, value in _index_state(one).items():
    np.testing.assert_array_equal(_index_state(two)[key], value, err_msg=key)
  assert_same_state(state(one), state(two), rtol=2e-5, atol=1e-6)


def test_a_compiled_step_trains_the_uncompiled_model(tmp_path):
  plain = _trainer(tmp_path / "plain")
  plain.train()
  compiled = _trainer(tmp_path / "xla", jit_compile=True)
  compiled.train()
  for key, value in _index_state(plain.run).items():
    np.testing.assert_array_equal(
      _index_state(compiled.run)[key], value, err_msg=key
    )
  assert_same_state(state(plain.run), state(compiled.run), rtol=1e-5, atol=1e-6)


def test_a_stopped_run_resumes_bit_identical(tmp_path):
  """Stopped after 8 steps and resumed to 12 == 12 steps at once: tables,
  slots, dense weights and every index (ids, rows, counters)."""
  whole = _trainer(tmp_path / "whole")
  whole.train()
  _trainer(tmp_path / "parts", train_steps=8).train()
  resumed = _trainer(tmp_path / "parts")
  resumed.train()
  assert int(resumed.run.global_step.numpy()) == 12
  for key, value in _index_state(whole.run).items():
    np.testing.assert_array_equal(
      _index_state(resumed.run)[key], value, err_msg=key
    )
  assert_same_state(state(whole.run), state(resumed.run))


def test_raw_ids_into_a_table_that_takes_rows_are_refused(tmp_path):
  """C2's raw ids would be refused as out of range at the first step (or,
  below its size by chance, read unrelated rows): refused before any table,
  naming the feature and both ways to map it."""
  with pytest.raises(PlacementSettingsError, match=r"\['C2'\].*HashedIds"):
    _trainer(tmp_path, vocabularies={"C1": POLICY})
