"""The configuration, table values and batches the sharded-backend tests share.

Imported by the in-process cluster script (`sharded_run.py`, which runs the
sharded backend) and by the tests (which run the references), so both sides
see exactly the same numbers. Odd sizes catch shape bugs: vocabularies 23, 11
and 5 over 2 shards are split 12/11, 6/5 and 3/2.
"""

import numpy as np
import tensorflow as tf

import recsys  # noqa: F401  (Keras 2 before TensorFlow)

E = tf.tpu.experimental.embedding
BATCH, STEPS, SEQ = 5, 2, 3


def feature_config() -> dict[str, "E.FeatureConfig"]:
  """users (Adagrad, mean) with a bag and a sequence feature; items (FTRL,
  sqrtn, weighted bags); ads (non-lazy Adam, sum, dense [B, 2] ids)."""
  users = E.TableConfig(
    23, 7, combiner="mean", name="users", optimizer=E.Adagrad(0.1)
  )
  items = E.TableConfig(
    11,
    11,
    combiner="sqrtn",
    name="items",
    optimizer=E.FTRL(0.2, l2_regularization_strength=0.01),
  )
  ads = E.TableConfig(
    5, 3, combiner="sum", name="ads", optimizer=E.Adam(0.05, lazy_adam=False)
  )
  return {
    "user": E.FeatureConfig(users, name="user"),
    "history": E.FeatureConfig(users, max_sequence_length=SEQ, name="history"),
    "item": E.FeatureConfig(items, name="item"),
    "ad": E.FeatureConfig(ads, name="ad"),
  }


def table_values() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(11)
  return {
    name: rng.normal(size=shape).astype(np.float32)
    for name, shape in (
      ("users", (23, 7)),
      ("items", (11, 11)),
      ("ads", (5, 3)),
    )
  }


def raw_batches() -> list[dict]:
  """Per step: Python lists of ids / weights and the cotangents of the loss."""
  rng = np.random.default_rng(7)
  out = []
  for _ in range(STEPS):
    bag = lambda vocab, hi: [
      list(rng.integers(0, vocab, rng.integers(1, hi))) for _ in range(BATCH)
    ]
    user, history, item = bag(23, 5), bag(23, 6), bag(11, 4)
    item_w = [
      list(rng.uniform(0.5, 2.0, len(r)).astype(np.float32)) for r in item
    ]
    ad = rng.integers(0, 5, (BATCH, 2))
    cot = {
      "user": rng.normal(size=(BATCH, 7)),
      "history": rng.normal(size=(BATCH, SEQ, 7)),
      "item": rng.normal(size=(BATCH, 11)),
      "ad": rng.normal(size=(BATCH, 3)),
    }
    out.append(
      {
        "user": user,
        "history": history,
        "item": item,
        "item_w": item_w,
        "ad": ad,
        "cot": {k: v.astype(np.float32) for k, v in cot.items()},
      }
    )
  return out


def tensors(raw: dict) -> tuple[dict, dict, dict]:
  """(features, weights, cotangents) as tensors for `backend.lookup`."""
  rag = lambda rows, dtype: tf.ragged.constant(rows, dtype=dtype)
  features = {
    "user": rag(raw["user"], tf.int64),
    "history": rag(raw["history"], tf.int64),
    "item": rag(raw["item"], tf.int64),
    "ad": tf.constant(raw["ad"], tf.int64),
  }
  weights = {
    "user": None,
    "history": None,
    "item": rag(raw["item_w"], tf.float32),
    "ad": None,
  }
  cot = {k: tf.constant(v) for k, v in raw["cot"].items()}
  return features, weights, cot
