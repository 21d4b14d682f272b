"""Fuzz: hostile inputs to an exported signature (issue 28).

A small ranking model (one-hot "user", weighted multi-hot "tags" padded to
`[B, 3]`, dense `[B, 3]`) is exported and loaded back; each case sends its
id signature inputs of random batch lengths, ranks, widths and ids (in and
out of the vocabulary, -1 padding where it is allowed and where it is not).
Each call must give the reference scores (the trainer's own lookups and
model, in this process) or an InvalidArgumentError naming what is wrong: the
inputs and their shapes, or the feature, its vocabulary and the id.
FUZZ_SEED=<n> runs another draw.
"""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

from recsys.features import EmbeddingSettings
from recsys.models import DLRM
from recsys.serving import export as export_lib
from recsys.serving.lookup import serving_activations
from recsys.training import Trainer
from tests.training.sources import ArraySource

V, W, DENSE = 23, 3, 3  # ArraySource's vocabulary, tag width, dense width
CASES = 60


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(trainer, loaded serving_default signature) of an untrained model."""
  root = tmp_path_factory.mktemp("fuzz")
  trainer = Trainer(
    str(root / "run"),
    ArraySource(),
    functools.partial(DLRM, bottom_mlp=(5,), top_mlp=(5,)),
    embedding=EmbeddingSettings(dim=5),
    global_batch_size=8,
    train_steps=0,
    progress_bar=False,
    summaries=False,
  )
  path = export_lib.export(trainer.run, str(root / "export"))
  return trainer, tf.saved_model.load(path).signatures["serving_default"]


def _reference(trainer, inputs):
  """Scores of valid inputs through the training backend's lookups."""
  mask = inputs["tags"] >= 0
  features = {
    "categorical": {
      "user": tf.constant(inputs["user"]),
      "tags": tf.ragged.boolean_mask(inputs["tags"], mask),
    },
    "weights": {"tags": tf.ragged.boolean_mask(inputs["tags_weights"], mask)},
    "dense": tf.constant(inputs["dense"]),
  }
  acts = serving_activations(trainer.backend, features, ["user", "tags"])
  return trainer.model(acts, features).numpy()


def _draw(rng):
  """Inputs, and why they are wrong: ("shape", input) / ("id", feature)."""
  b = int(rng.integers(1, 5))
  users = rng.integers(0, V, b)
  lengths = rng.integers(1, W + 1, b)
  tags = np.where(
    np.arange(W) < lengths[:, None], rng.integers(0, V, (b, W)), -1
  )
  inputs = {
    "user": users.astype(np.int64),
    "tags": tags.astype(np.int64),
    "tags_weights": rng.uniform(0.5, 1.5, (b, W)).astype(np.float32),
    "dense": rng.normal(size=(b, DENSE)).astype(np.float32),
  }
  wrong = None
  kind = rng.random()
  if kind < 0.3:  # a shape: another batch length, rank or width
    name = str(rng.choice(sorted(inputs)))
    value = inputs[name]
    how = int(rng.integers(4))
    if how == 0:
      value = np.concatenate([value, value[:1]])  # one more row
    elif how == 1:
      value = value[..., None]  # one more dim
    elif how == 2 and value.ndim == 2:
      value = value[:, :-1]  # narrower
    elif how == 3 and value.ndim == 2:
      value = value[:, 0]  # one dim less
    else:
      value = np.concatenate([value, value])
    inputs[name] = value
    wrong = ("shape", name)
  elif kind < 0.6:  # an id out of its vocabulary
    name = str(rng.choice(["user", "tags"]))
    bad = int(rng.choice([V, V + 1000, -2, -(2**40), 2**40]))
    if name == "user" and rng.random() < 0.3:
      bad = -1  # padding is for multi-hot rows only
    row = int(rng.integers(b))
    if name == "user":
      inputs["user"][row] = bad
    else:
      inputs["tags"][row, 0] = bad
    wrong = ("id", name, bad, row)
  return inputs, wrong


def test_hostile_serving_inputs_give_the_reference_or_a_named_error(exported):
  trainer, serve = exported
  rng = np.random.default_rng(int(os.environ.get("FUZZ_SEED", 28)))
  outcomes = {"ok": 0, "shape": 0, "id": 0}
  for case in range(CASES):
    inputs, wrong = _draw(rng)
    context = f"case {case}: {wrong} {inputs}"
    try:
      got = serve(**{k: tf.constant(v) for k, v in inputs.items()})
    except tf.errors.InvalidArgumentError as e:
      message = str(e)
      assert wrong is not None, f"{context}: unexpected {message}"
      if wrong[0] == "shape":
        name = wrong[1]
        shape = ", ".join(str(d) for d in inputs[name].shape)
        assert "serving inputs of shapes" in message, context
        assert f"{name} [{shape}]" in message, f"{context}: {message}"
      else:
        _, name, bad, row = wrong
        assert (
          f"feature {name} (table {name}, vocabulary_size={V}) got id "
          f"{bad} at batch row {row}; ids must be in [0, {V})" in message
        ), f"{context}: {message}"
      outcomes[wrong[0]] += 1
      continue
    assert wrong is None, f"{context}: served {got}"
    np.testing.assert_allclose(
      got["scores"].numpy(),
      _reference(trainer, inputs),
      rtol=1e-5,
      atol=1e-6,
      err_msg=context,
    )
    outcomes["ok"] += 1
  assert min(outcomes.values()) >= 10, outcomes
