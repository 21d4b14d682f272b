"""Every table starts from its own initial values, reproducible from the seed.

One gin-built initializer instance is shared by all tables; the trainer gives
each table a copy seeded from the run seed and the table's name.
"""

import functools
import warnings

import numpy as np
import pytest

from recsys._keras import keras, tf
from recsys.features import EmbeddingSettings
from recsys.models import DLRM
from recsys.training import Trainer
from tests.training.sources import ArraySource

E = tf.tpu.experimental.embedding


def initial_tables(tmp_path, seed, initializer):
  """The tables right after construction ("user" and "tags": both 23 x 7)."""
  trainer = Trainer(
    str(tmp_path),
    ArraySource(),
    functools.partial(DLRM, bottom_mlp=(7,), top_mlp=(7,)),
    embedding=EmbeddingSettings(dim=7, initializer=initializer),
    embedding_optimizer=E.SGD(0.1),
    global_batch_size=10,
    train_steps=1,
    progress_bar=False,
    summaries=False,
    seed=seed,
  )
  return {
    t.name: v.numpy() for t, v in trainer.backend.embedding_tables.items()
  }


@pytest.mark.parametrize(
  "shared",
  [
    None,  # TF's default
    keras.initializers.TruncatedNormal(stddev=0.05),  # one gin instance
  ],
  ids=["default", "shared_instance"],
)
def test_same_shape_tables_start_different_and_follow_the_seed(
  tmp_path, shared
):
  with warnings.catch_warnings():
    warnings.simplefilter(
      "error", UserWarning
    )  # Keras: "called multiple times"
    a = initial_tables(tmp_path / "a", seed=3, initializer=shared)
  assert a["user"].shape == a["tags"].shape == (23, 7)
  assert not np.allclose(a["user"], a["tags"])
  b = initial_tables(tmp_path / "b", seed=3, initializer=shared)
  c = initial_tables(tmp_path / "c", seed=4, initializer=shared)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert not np.allclose(a[name], c[name]), name
  if shared is not None:  # the configured distribution is kept
    assert np.abs(a["user"]).max() <= 2 * 0.05 + 1e-6
