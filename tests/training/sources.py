"""Small in-memory data sources for trainer tests (the data contract, no files).

`ArraySource` serves fixed NumPy arrays in order, so the global batch of step
s is examples [s*G, (s+1)*G) whatever the number of replicas: what the
1-vs-2-replica test needs. Labels follow a planted logistic model so a
trained model has something to learn.
"""

import numpy as np
import tensorflow as tf

from recsys.data.pipeline import BatchRequest, DataSource
from recsys.feature_spec import FeatureSpec


class ArraySource(DataSource):
  """CTR-shaped data: one-hot "user", multi-hot weighted "tags", dense.

  Args:
    num_examples: examples in each split.
    num_dense: dense width.
    vocab: vocabulary of both features; "tags" shares no table.
    seed: NumPy seed of the data.
  """

  def __init__(
    self,
    num_examples: int = 240,
    num_dense: int = 3,
    vocab: int = 23,
    seed: int = 0,
  ):
    self.num_dense = num_dense
    self.feature_specs = [
      FeatureSpec("user", vocab),
      FeatureSpec("tags", vocab, multi_hot=True, max_ids=3, weighted=True),
    ]
    rng = np.random.default_rng(seed)
    self._splits = {}
    w_user = rng.normal(size=vocab)
    w_tag = rng.normal(size=vocab)
    w_dense = rng.normal(size=num_dense)
    for split in ("train", "eval"):
      users = rng.integers(0, vocab, num_examples)
      lengths = rng.integers(1, 4, num_examples)
      tags = rng.integers(0, vocab, int(lengths.sum()))
      tag_w = rng.uniform(0.5, 1.5, int(lengths.sum())).astype(np.float32)
      dense = rng.normal(size=(num_examples, num_dense)).astype(np.float32)
      row = np.repeat(np.arange(num_examples), lengths)
      tag_logit = np.bincount(row, w_tag[tags] * tag_w, num_examples)
      logit = 2 * w_user[users] + tag_logit + dense @ w_dense
      labels = (
        rng.uniform(size=num_examples) < 1 / (1 + np.exp(-logit))
      ).astype(np.float32)
      self._splits[split] = (users, lengths, tags, tag_w, dense, labels)

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    users, lengths, tags, tag_w, dense, labels = self._splits[
      "train" if request.training else "eval"
    ]
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tags_rt = tf.RaggedTensor.from_row_splits(tags.astype(np.int64), splits)
    weights_rt = tf.RaggedTensor.from_row_splits(tag_w, splits)
    ds = tf.data.Dataset.from_tensor_slices(
      (
        {
          "dense": dense,
          "categorical": {"user": users.astype(np.int64), "tags": tags_rt},
          "weights": {"tags": weights_rt},
        },
        labels,
      )
    )
    if request.pipelines > 1:
      ds = ds.shard(request.pipelines, request.pipeline)
    if request.repeat:
      ds = ds.repeat()
    return ds.batch(request.batch_size, drop_remainder=request.drop_remainder)
