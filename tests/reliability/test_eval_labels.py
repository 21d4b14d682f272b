"""A NaN label in the evaluation data is refused, naming where (issue 43).

A rating model evaluated on data with one NaN label wrote
`eval/rmse = NaN` (and a NaN `eval/loss`) to metrics.json, without a
warning. Now the evaluation split's labels are checked as they are read: a
NaN or infinite one stops the evaluation with an error naming the source,
the split and the example's position, and no metrics are written. The run
is a user's: unbatched `tf.data.Dataset`s and TF's `FeatureConfig`s.
"""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

from recsys.models import DCNv2
from recsys.training import Trainer
from tests.training.few_steps import quiet

E = tf.tpu.experimental.embedding
NUM_EXAMPLES = 40


def _ratings(seed, nan_at=None):
  """An unbatched dataset of (user, item) -> rating; `nan_at`'s is NaN."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(1, 6, NUM_EXAMPLES).astype(np.float32)
  for row, value in nan_at or {}:
    labels[row] = value
  features = {
    "user": rng.integers(0, 9, NUM_EXAMPLES),
    "item": rng.integers(0, 11, NUM_EXAMPLES),
  }
  return tf.data.Dataset.from_tensor_slices((features, labels))


def _trainer(model_dir, eval_data, **settings):
  feature_config = {
    "user": E.FeatureConfig(E.TableConfig(9, 4, name="user")),
    "item": E.FeatureConfig(E.TableConfig(11, 4, name="item")),
  }
  return Trainer(
    str(model_dir),
    _ratings(0),
    functools.partial(
      DCNv2,
      objective="mse",
      num_cross_layers=1,
      projection_dim=2,
      deep_mlp=(4,),
    ),
    eval_source=eval_data,
    feature_config=feature_config,
    **quiet(
      global_batch_size=8,
      eval_batch_size=8,
      train_steps=2,
      steps_per_loop=1,
      **settings,
    ),
  )


@pytest.mark.parametrize(
  "row, value", [(13, float("nan")), (0, float("inf")), (39, float("nan"))]
)
def test_a_non_finite_evaluation_label_stops_the_run_naming_it(
  tmp_path, row, value
):
  trainer = _trainer(tmp_path, _ratings(1, nan_at={(row, value)}))
  with pytest.raises(tf.errors.InvalidArgumentError) as e:
    trainer.train()
  message = str(e.value)
  assert (
    f"the evaluation split of DatasetSource: example {row} (counted from "
    f"0) has label {value}; evaluation labels must be finite numbers" in message
  ), message
  assert not os.path.exists(tmp_path / "metrics.json")


def test_evaluate_refuses_the_label_on_every_strategy(tmp_path):
  """Two replicas read one pipeline: the position is still the split's."""
  from tests.conftest import mirrored_strategy  # noqa: PLC0415

  trainer = _trainer(
    tmp_path,
    _ratings(1, nan_at={(21, float("nan"))}),
    strategy=mirrored_strategy(2),
  )
  with pytest.raises(tf.errors.InvalidArgumentError) as e:
    trainer.evaluate()
  assert "DatasetSource: example 21 (counted from 0) has label nan" in str(
    e.value
  )
  # Finite labels evaluate as before: every example scored once.
  fine = _trainer(tmp_path / "fine", _ratings(1), strategy=mirrored_strategy(2))
  metrics = fine.evaluate()
  assert metrics["eval/examples"] == NUM_EXAMPLES
  assert np.isfinite(metrics["eval/loss"])
