"""A SavedModel of a Keras model with the layer serves without this project.

Both `tf.saved_model.save` (with a serving function) and Keras's
`model.save(..., save_format="tf")` are loaded.

The model is trained with `fit`, saved with `tf.saved_model.save`, and loaded
in a fresh Python process in which importing `recsys` or `backends` raises
(an import blocker), from another directory with PYTHONPATH empty: its
predictions must equal the trained model's. Lookups outside a training step
are plain TF ops (no custom kernels, no Python of ours).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from recsys import layers
from recsys._keras import keras, tf

E = tf.tpu.experimental.embedding


class Ranker(keras.Model):
  """User id and a bag of movie ids -> a score."""

  def __init__(self):
    super().__init__()
    self.embedding = layers.Embedding(
      {
        "user": E.FeatureConfig(E.TableConfig(23, 7, name="users")),
        "movies": E.FeatureConfig(
          E.TableConfig(29, 11, name="movies", combiner="mean")
        ),
      },
      optimizer=E.Adagrad(0.1),
    )
    self.score = keras.layers.Dense(1)

  def call(self, features, training=False):
    acts = self.embedding(features, training=training)
    return self.score(tf.concat([acts["user"], acts["movies"]], -1))[:, 0]


@pytest.mark.slow  # a second Python process imports TensorFlow (~10 s)
def test_saved_model_serves_in_a_process_without_the_project(tmp_path):
  rng = np.random.default_rng(0)
  n = 32
  x = {
    "user": rng.integers(0, 23, n),
    "movies": tf.ragged.constant(
      [list(rng.integers(0, 29, 1 + i % 3)) for i in range(n)], tf.int64
    ),
  }
  y = rng.normal(size=n).astype("float32")
  model = Ranker()
  model.compile(optimizer="adam", loss="mse")
  before = {
    c.name: v.numpy() for c, v in model.embedding.embedding_tables.items()
  }
  model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), verbose=0)

  @tf.function(
    input_signature=[
      tf.TensorSpec([None], tf.int64),
      tf.RaggedTensorSpec([None, None], tf.int64),
    ]
  )
  def serve(user, movies):
    return {"scores": model({"user": user, "movies": movies}, training=False)}

  export_dir = str(tmp_path / "saved")
  root = tf.Module()
  root.model, root.serve = model, serve
  tf.saved_model.save(root, export_dir)
  keras_dir = str(tmp_path / "keras_saved")
  model.save(keras_dir, save_format="tf")  # Keras's SavedModel format
  want = serve(tf.constant(x["user"]), x["movies"])["scores"].numpy()
  for c, var in model.embedding.embedding_tables.items():  # fit trained them
    assert not np.allclose(var.numpy(), before[c.name])

  script = textwrap.dedent(f"""
      import importlib.abc, json, sys
      class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
          if name.split(".")[0] in ("recsys", "backends"):
            raise ImportError("the SavedModel tried to import " + name)
          return None
      sys.meta_path.insert(0, Blocker())
      import tensorflow as tf
      inputs = json.loads(sys.stdin.read())
      loaded = tf.saved_model.load({export_dir!r})
      out = loaded.serve(tf.constant(inputs["user"], tf.int64),
                         tf.ragged.constant(inputs["movies"], tf.int64))
      features = {{"user": tf.constant(inputs["user"], tf.int64),
                   "movies": tf.ragged.constant(inputs["movies"], tf.int64)}}
      keras_out = tf.saved_model.load({keras_dir!r})(features, training=False)
      assert not any(m.split(".")[0] in ("recsys", "backends") for m in sys.modules)
      print(json.dumps([out["scores"].numpy().tolist(),
                        keras_out.numpy().tolist()]))
      """)
  inputs = {"user": x["user"].tolist(), "movies": x["movies"].to_list()}
  env = dict(os.environ, PYTHONPATH="", TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run(
    [sys.executable, "-c", script],
    input=json.dumps(inputs),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=str(tmp_path),
    env=env,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  served, served_keras = json.loads(result.stdout.strip().splitlines()[-1])
  np.testing.assert_allclose(
    np.array(served, np.float32), want, rtol=1e-6, atol=1e-6
  )
  np.testing.assert_allclose(
    np.array(served_keras, np.float32), want, rtol=1e-6, atol=1e-6
  )
