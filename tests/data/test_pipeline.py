"""DataSource.dataset and distribute(): argument checks, per-replica batches, shared batching."""

import numpy as np
import pytest
import tensorflow as tf

import recsys  # noqa: F401
from recsys.data import (
  DataSource,
  FeatureSpec,
  InvalidBatchSizeError,
  SyntheticCTR,
  SyntheticRetrieval,
)
from recsys.run.input import distribute
from tests.conftest import mirrored_strategy

SMALL = dict(
  num_dense=3,
  vocab_sizes=(23, 11),
  multi_hot_sizes=(1, 4),
  weighted=(False, True),
  oracle_examples=1 << 12,
)


def test_distribute_gives_per_replica_batches_of_the_global_batch(strategy):
  source = SyntheticCTR(**SMALL)
  options = tf.distribute.InputOptions(experimental_fetch_to_device=False)
  dist = distribute(
    strategy, source, global_batch_size=10, input_options=options
  )
  features, labels = next(iter(dist))
  per_replica = strategy.experimental_local_results(labels)
  assert len(per_replica) == strategy.num_replicas_in_sync
  assert all(
    l.shape == (10 // strategy.num_replicas_in_sync,) for l in per_replica
  )
  bags = strategy.experimental_local_results(features["categorical"]["C2"])
  assert all(isinstance(b, tf.RaggedTensor) for b in bags)
  # Together the replicas hold the first 10 examples of the training split.
  want = source.examples(tf.range(10, dtype=tf.int64))[0]["categorical"][
    "C1"
  ].numpy()
  got = np.concatenate(
    [
      c.numpy()
      for c in strategy.experimental_local_results(
        features["categorical"]["C1"]
      )
    ]
  )
  np.testing.assert_array_equal(np.sort(got), np.sort(want))


def test_distribute_runs_a_step_with_ragged_features():
  strategy = mirrored_strategy(2)
  source = SyntheticRetrieval(num_users=23, num_items=11)
  dist = distribute(
    strategy,
    source,
    global_batch_size=6,
    input_options=tf.distribute.InputOptions(
      experimental_fetch_to_device=False
    ),
  )

  @tf.function
  def step(features, labels):
    def fn(features, labels):
      del labels
      return tf.reduce_sum(features["categorical"]["item_genres"].row_lengths())

    return strategy.reduce(
      "SUM", strategy.run(fn, args=(features, labels)), axis=None
    )

  features, labels = next(iter(dist))
  total = int(step(features, labels))
  assert total >= 6  # every item has at least one genre


def test_global_batch_must_split_over_replicas():
  strategy = mirrored_strategy(2)
  with pytest.raises(InvalidBatchSizeError, match="multiple of 2"):
    distribute(strategy, SyntheticCTR(**SMALL), global_batch_size=7)
  with pytest.raises(InvalidBatchSizeError, match="positive integer"):
    SyntheticCTR(**SMALL).dataset(0)


def test_sources_are_gin_registered():
  import gin  # pylint: disable=g-import-not-at-top

  for name in ("SyntheticCTR", "SyntheticRetrieval", "CriteoTSV", "MovieLens"):
    assert gin.get_configurable(name) is not None  # raises if not registered
  gin.parse_config("""
      SyntheticCTR.num_dense = 2
      SyntheticCTR.vocab_sizes = (23, 7)
      SyntheticCTR.multi_hot_sizes = 1
      SyntheticCTR.oracle_examples = 4096
  """)
  source = gin.get_configurable("SyntheticCTR")()
  assert source.num_dense == 2 and [
    s.vocabulary_size for s in source.feature_specs
  ] == [23, 7]


class _Counting(DataSource):
  """A source through the `_batches` hook: examples 0..9, labels = index."""

  feature_specs = [FeatureSpec("id", 10)]

  def _batches(self, request):
    ds = tf.data.Dataset.range(request.pipeline, 10, request.pipelines)
    if request.repeat:
      ds = ds.repeat()
    return ds.batch(
      request.batch_size, drop_remainder=request.drop_remainder
    ).map(lambda i: ({"categorical": {"id": i}}, tf.cast(i, tf.float32)))


class _OwnDataset(DataSource):
  """A source that overrides `dataset` itself, as sources written before the hook do."""

  feature_specs = [FeatureSpec("id", 10)]

  def dataset(
    self,
    batch_size,
    *,
    training=True,
    input_context=None,
    drop_remainder=True,
    repeat=None,
  ):
    return (
      tf.data.Dataset.range(10)
      .batch(batch_size)
      .map(lambda i: ({"categorical": {"id": i}}, tf.cast(i, tf.float32)))
    )


class _Context:
  input_pipeline_id, num_input_pipelines = 1, 2


def test_dataset_checks_and_resolves_arguments_for_the_source():
  source = _Counting()
  labels = [l.numpy().tolist() for _, l in source.dataset(2, repeat=False)]
  assert labels == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  labels = [
    l.numpy().tolist()
    for _, l in source.dataset(
      2, training=False, input_context=_Context(), drop_remainder=False
    )
  ]
  assert labels == [[1, 3], [5, 7], [9]]  # evaluation: not repeated
  assert len(list(source.dataset(2).take(7))) == 7  # training: repeated
  with pytest.raises(InvalidBatchSizeError, match="positive integer"):
    source.dataset(2.5)
  ds = source.dataset(3)
  assert ds.element_spec[1].shape == (3,)
  assert (
    ds.options().experimental_distribute.auto_shard_policy
    == tf.data.experimental.AutoShardPolicy.OFF
  )


def test_a_source_may_still_override_dataset():
  labels = [l.numpy().tolist() for _, l in _OwnDataset().dataset(4)]
  assert labels == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_source_without_batches_says_what_to_implement():
  class Empty(DataSource):
    feature_specs = []

  with pytest.raises(NotImplementedError, match="_batches"):
    Empty().dataset(2)


@pytest.mark.parametrize(
  "make",
  [
    lambda: SyntheticCTR(**SMALL, num_examples=10),
    lambda: SyntheticRetrieval(num_users=23, num_items=11, num_examples=10),
  ],
  ids=["ctr", "retrieval"],
)
def test_indexed_sources_keep_the_batch_shape_static_when_the_split_divides(
  make,
):
  source = make()
  whole = source.dataset(5, drop_remainder=False, repeat=False)
  assert whole.element_spec[1].shape == (5,)
  assert [l.shape[0] for _, l in whole] == [5, 5]
  partial = source.dataset(4, drop_remainder=False, repeat=False)
  assert partial.element_spec[1].shape.as_list() == [None]
  assert [l.shape[0] for _, l in partial] == [4, 4, 2]
