"""distribute(): per-replica batches under a 2-replica strategy, and batch-size errors."""

import numpy as np
import pytest

import recsys  # noqa: F401
import tensorflow as tf

from recsys.data import InvalidBatchSizeError, SyntheticCTR, SyntheticRetrieval, distribute
from tests.conftest import mirrored_strategy

SMALL = dict(num_dense=3, vocab_sizes=(23, 11), multi_hot_sizes=(1, 4), weighted=(False, True),
             oracle_examples=1 << 12)


def test_distribute_gives_per_replica_batches_of_the_global_batch(strategy):
  source = SyntheticCTR(**SMALL)
  options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
  dist = distribute(strategy, source, global_batch_size=10, input_options=options)
  features, labels = next(iter(dist))
  per_replica = strategy.experimental_local_results(labels)
  assert len(per_replica) == strategy.num_replicas_in_sync
  assert all(l.shape == (10 // strategy.num_replicas_in_sync,) for l in per_replica)
  bags = strategy.experimental_local_results(features["categorical"]["C2"])
  assert all(isinstance(b, tf.RaggedTensor) for b in bags)
  # Together the replicas hold the first 10 examples of the training split.
  want = source.examples(tf.range(10, dtype=tf.int64))[0]["categorical"]["C1"].numpy()
  got = np.concatenate([c.numpy() for c in
                        strategy.experimental_local_results(features["categorical"]["C1"])])
  np.testing.assert_array_equal(np.sort(got), np.sort(want))


def test_distribute_runs_a_step_with_ragged_features():
  strategy = mirrored_strategy(2)
  source = SyntheticRetrieval(num_users=23, num_items=11)
  dist = distribute(strategy, source, global_batch_size=6,
                    input_options=tf.distribute.InputOptions(experimental_fetch_to_device=False))

  @tf.function
  def step(features, labels):
    def fn(features, labels):
      del labels
      return tf.reduce_sum(features["categorical"]["item_genres"].row_lengths())
    return strategy.reduce("SUM", strategy.run(fn, args=(features, labels)), axis=None)

  features, labels = next(iter(dist))
  total = int(step(features, labels))
  assert total >= 6                      # every item has at least one genre


def test_global_batch_must_split_over_replicas():
  strategy = mirrored_strategy(2)
  with pytest.raises(InvalidBatchSizeError, match="multiple of 2"):
    distribute(strategy, SyntheticCTR(**SMALL), global_batch_size=7)
  with pytest.raises(InvalidBatchSizeError, match="positive integer"):
    SyntheticCTR(**SMALL).dataset(0)


def test_sources_are_gin_registered():
  import gin  # pylint: disable=g-import-not-at-top
  for name in ("SyntheticCTR", "SyntheticRetrieval", "CriteoTSV", "MovieLens"):
    assert gin.get_configurable(name) is not None       # raises if not registered
  gin.parse_config("""
      SyntheticCTR.num_dense = 2
      SyntheticCTR.vocab_sizes = (23, 7)
      SyntheticCTR.multi_hot_sizes = 1
      SyntheticCTR.oracle_examples = 4096
  """)
  source = gin.get_configurable("SyntheticCTR")()
  assert source.num_dense == 2 and [s.vocabulary_size for s in source.feature_specs] == [23, 7]
