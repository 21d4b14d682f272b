"""The Trainer under the mixed policy its float16 refusal recommends:
`mixed_bfloat16` trains the bundled ranking models (they failed with a
dtype error at their first step) and tracks float32, on batch slices too."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from recsys._keras import keras
from recsys.models import DCNv2
from tests.training import test_trainer

MODELS = {
  "dlrm": test_trainer.MODEL,
  "dcn": functools.partial(DCNv2, deep_mlp=(11,), num_cross_layers=2),
}


def _trained(tmp_path, monkeypatch, model, policy):
  monkeypatch.setattr(test_trainer, "MODEL", MODELS[model])
  keras.mixed_precision.set_global_policy(policy)
  try:
    trainer = test_trainer.make_trainer(
      tmp_path / policy,
      train_steps=4,
      optimizer=tf.tpu.experimental.embedding.Adam(0.01),
      batch_slices=2,
    )
    return trainer, trainer.train()
  finally:
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_mixed_bfloat16_trains_the_ranking_models_as_float32_does(
  tmp_path, monkeypatch, model
):
  full, full_metrics = _trained(tmp_path, monkeypatch, model, "float32")
  mixed, mixed_metrics = _trained(
    tmp_path, monkeypatch, model, "mixed_bfloat16"
  )
  assert mixed.model.compute_dtype == "bfloat16"
  assert {v.dtype for v in mixed.model.trainable_variables} == {tf.float32}
  full_state, mixed_state = (
    test_trainer.state(full.run),
    test_trainer.state(mixed.run),
  )
  tables = [k for k in full_state if k.startswith(("table/", "slot/"))]
  assert tables
  for key in tables:
    np.testing.assert_allclose(
      mixed_state[key], full_state[key], atol=2e-2, err_msg=key
    )
  for a, b in zip(
    mixed.model.trainable_variables, full.model.trainable_variables
  ):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-2, err_msg=b.name)
  for key in ("train/loss", "eval/loss", "eval/auc"):
    assert np.isfinite(mixed_metrics[key]), key
    assert abs(mixed_metrics[key] - full_metrics[key]) < 0.02, key
