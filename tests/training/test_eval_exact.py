"""Evaluation scores every example exactly once, with the exact mean loss.

Reference: the trained model's logits over the whole eval split in one
batch, scored by NumPy (mean BCE, accuracy) and a fresh Keras AUC; the
eval batch (8) differs from the training batch (10) and does not divide the
split, on one replica, two replicas and in compiled steps.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from recsys.features import EmbeddingSettings
from recsys.models import DLRM
from recsys.run import eval_padding
from recsys.serving.lookup import serving_activations
from recsys.training import EmptyEvalSetError, Trainer
from tests.conftest import mirrored_strategy
from tests.training.few_steps import few_steps
from tests.training.sources import ArraySource

E = tf.tpu.experimental.embedding
EVAL_BATCH = 8


def make(tmp_path, num_eval, replicas=1, jit_compile=None):
  return Trainer(
    str(tmp_path),
    ArraySource(),
    functools.partial(DLRM, bottom_mlp=(11, 7), top_mlp=(11,)),
    strategy=mirrored_strategy(replicas) if replicas > 1 else None,
    eval_source=ArraySource(num_examples=num_eval, seed=5),
    embedding=EmbeddingSettings(dim=7),
    embedding_optimizer=E.Adagrad(0.1),
    **few_steps(
      eval_batch_size=EVAL_BATCH,
      steps_per_loop=2,
      eval_steps=None,
      seed=3,
      jit_compile=jit_compile,
    ),
  )


def reference(trainer, num_eval):
  """Mean BCE, AUC and accuracy of the model's logits over the whole split."""
  features, labels = next(
    iter(
      trainer.run.eval_source.dataset(
        num_eval, training=False, drop_remainder=False, repeat=False
      )
    )
  )
  acts = serving_activations(trainer.backend, features, ["user", "tags"])
  z = trainer.model.logits(acts, features).numpy().astype(np.float64)
  y = labels.numpy().astype(np.float64)
  auc = tf.keras.metrics.AUC(num_thresholds=1000, from_logits=True)
  auc.update_state(y, z)
  return {
    "eval/loss": np.mean(
      np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    ),
    "eval/logloss": np.mean(
      np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    ),
    "eval/accuracy": np.mean((z > 0) == (y > 0.5)),
    "eval/auc": float(auc.result()),
    "eval/examples": num_eval,
  }


@pytest.mark.parametrize(
  "num_eval,replicas,jit_compile",
  [
    (5, 1, None),  # smaller than one eval batch
    (9, 1, None),  # one batch + 1
    (9, 2, None),  # 4 + 4 + 1 rows and a padding batch: two steps
    (9, 1, True),  # compiled (XLA) steps on padded batches
  ],
  ids=["lt_batch", "batch+1", "2rep_batch+1", "jit_batch+1"],
)
def test_every_example_is_scored_once(
  tmp_path, num_eval, replicas, jit_compile
):
  trainer = make(tmp_path, num_eval, replicas, jit_compile)  # initial weights
  got, want = trainer.evaluate(), reference(trainer, num_eval)
  assert got["eval/examples"] == num_eval
  for key, value in want.items():
    np.testing.assert_allclose(
      got[key], value, rtol=2e-5, atol=1e-6, err_msg=key
    )


def test_empty_eval_split_is_refused(tmp_path):
  trainer = make(tmp_path, num_eval=0)
  with pytest.raises(EmptyEvalSetError, match="ArraySource has no example"):
    trainer.evaluate()


def test_padded_batches_hold_every_example_once():
  """Ragged bags and dense rows survive padding; masks count the examples."""
  source = ArraySource(num_examples=11)
  ds = source.dataset(4, training=False, drop_remainder=False, repeat=False)
  batches = list(eval_padding.pad_eval_batches(ds, 4, batches_per_step=2))
  assert len(batches) == 4  # 4 + 4 + 3 rows, then one padding batch
  masks = np.stack([m.numpy() for _, _, m in batches])
  np.testing.assert_array_equal(masks.reshape(-1), [1] * 11 + [0] * 5)
  tags = tf.concat([f["categorical"]["tags"] for f, _, _ in batches], 0)
  want = next(iter(source.dataset(11, training=False, drop_remainder=False)))
  assert tags[:11].to_list() == want[0]["categorical"]["tags"].to_list()
  assert all(len(row) == 0 for row in tags[11:].to_list())
  for f, labels, _ in batches:
    assert f["dense"].shape == (4, 3) and labels.shape == (4,)
