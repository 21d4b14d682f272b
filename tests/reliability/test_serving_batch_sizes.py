"""Every input of every exported signature has one batch size (issue 43).

"top_k_raw" and "top_k" took `exclude_seen` of another length than
`user_id`: 2 users with 1 flag broadcast it, 1 user with 5 flags returned 5
rows, 3 flags for 2 users failed with a bare "Incompatible shapes". Here a
MovieLens ranking model (side features, timestamp, weighted histories) and
a retrieval model with seen items are exported from Python and loaded with
plain `tf.saved_model.load`; every signature is called with valid inputs,
then with each input in turn one row longer or shorter: each such call must
be refused by the SavedModel itself, naming every input and its size.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import MovieLens
from recsys.data.user_history import ItemHistory, UserHistory
from recsys.features import EmbeddingSettings
from recsys.models import DCNv2, TwoTower
from recsys.serving import export as export_lib
from recsys.testing.movielens import write_ml100k_like
from recsys.training import Trainer
from tests.training.few_steps import quiet

NUM_ITEMS = 17


def movielens_trainer(root, task, **source_args):
  """An untrained Trainer over generated ml-100k files (12 users, 17 items)."""
  data = write_ml100k_like(
    str(root / "ml"), num_users=12, num_items=NUM_ITEMS, num_ratings=120
  )
  if task == "retrieval":
    model = functools.partial(TwoTower, query_tower=(5,), candidate_tower=(5,))
  else:
    model = functools.partial(
      DCNv2, num_cross_layers=1, projection_dim=2, deep_mlp=(4,)
    )
  return Trainer(
    str(root / "run"),
    MovieLens(data, task=task, **source_args),
    model,
    embedding=EmbeddingSettings(dim=4),
    **quiet(global_batch_size=8, train_steps=0),
  )


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
  """{"ranking" | "retrieval": (export path, the loaded signatures)}."""
  out = {}
  for task, args in (
    (
      "ranking",
      dict(
        timestamp_buckets=3,
        history=UserHistory(weights="rating"),
        item_history=ItemHistory(weights="rating"),
      ),
    ),
    ("retrieval", dict(features=["user_id", "user_age", "item_id"])),
  ):
    root = tmp_path_factory.mktemp(task)
    trainer = movielens_trainer(root, task, **args)
    path = export_lib.export(trainer.run, str(root / "export"))
    out[task] = path, tf.saved_model.load(path).signatures
  return out


def _valid(spec, batch):
  """`batch` rows an input of `spec` accepts: raw id "1", id 1, weight 1."""
  shape = [batch] + spec.shape[1:].as_list()
  values = {
    tf.string: "1",
    tf.int64: 1,
    tf.float32: 1.0,
    tf.bool: True,
  }
  return tf.fill(shape, tf.constant(values[spec.dtype], spec.dtype))


def test_seen_flags_of_another_length_than_the_users_are_refused(exports):
  signatures = exports["retrieval"][1]
  cases = [  # (users, flags): the three calls
    (["1", "2"], [True]),  # broadcast over both users
    (["1"], [True] * 5),  # 5 rows for 1 user
    (["1", "2"], [True] * 3),  # "Incompatible shapes"
  ]
  for users, flags in cases:
    ids = {
      "top_k_raw": {"user_id": tf.constant(users)},
      "top_k": {
        "user_id": tf.ones([len(users)], tf.int64),
        "user_age": tf.ones([len(users)], tf.int64),
      },
    }
    for name, inputs in ids.items():
      with pytest.raises(tf.errors.InvalidArgumentError) as e:
        signatures[name](**inputs, exclude_seen=tf.constant(flags))
      message = str(e.value)
      assert (
        f"serving inputs of shapes exclude_seen [{len(flags)}]" in message
      ), (name, message)
      assert f"user_id [{len(users)}]" in message, (name, message)
      assert "one batch size B for every input" in message, (name, message)
    # The same users with one flag each are served, a row each.
    got = signatures["top_k_raw"](
      user_id=tf.constant(users),
      exclude_seen=tf.constant([True] * len(users)),
    )
    assert got["candidate_ids"].shape == (len(users), NUM_ITEMS)


@pytest.mark.parametrize("task", ["ranking", "retrieval"])
def test_every_input_of_every_signature_shares_the_batch_size(exports, task):
  signatures = exports[task][1]
  want = {
    "ranking": {"serving_default", "serving_raw"},
    "retrieval": {
      "serving_default",
      "serving_raw",
      "query_embeddings",
      "candidate_embeddings",
      "raw_query_embeddings",
      "raw_candidate_embeddings",
      "top_k",
      "top_k_raw",
    },
  }
  assert set(signatures) == want[task]
  checked = 0
  for name, signature in signatures.items():
    specs = signature.structured_input_signature[1]
    inputs = {n: _valid(spec, 3) for n, spec in specs.items()}
    outputs = signature(**inputs)
    for value in outputs.values():
      assert value.shape[0] == 3, (name, outputs)
    if len(specs) < 2:
      continue
    for wrong in specs:
      for rows in (2, 4):
        bad = dict(inputs, **{wrong: _valid(specs[wrong], rows)})
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
          signature(**bad)
        message = str(e.value)
        context = f"{task} {name}: {wrong} of {rows} rows: {message}"
        assert "serving inputs of shapes" in message, context
        assert f"{wrong} [{rows}" in message, context
        for other in specs:
          if other != wrong:
            assert f"{other} [3" in message, context
        checked += 1
  assert checked >= (30 if task == "ranking" else 8), checked


@pytest.mark.slow  # a serving process starts TensorFlow (if none has yet)
def test_the_refusal_needs_only_tensorflow(exports, tmp_path, serving_process):
  """The check is in the graph: a process without recsys refuses too
  (the session's, `tests/serving_process.py`)."""
  path = exports["retrieval"][0]
  error = serving_process.serve(
    tmp_path,
    path,
    {
      "x": (
        "top_k_raw",
        {"user_id": np.array(["1", "2"]), "exclude_seen": np.ones(3, bool)},
      )
    },
    expect_error=True,
  )
  assert "serving inputs of shapes exclude_seen [3], user_id [2]" in error
