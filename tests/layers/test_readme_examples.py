"""The README's Keras example (TFRS's basic ranking model with the layer) runs.

The model block is taken from README.md as written and trained with `fit`
on synthetic MovieLens-shaped data: the tables must move (trained by the
embedding optimizer, not left alone) and the loss must fall.
"""

import os
import re

import numpy as np

from recsys._keras import tf

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def readme_model_block() -> str:
  text = open(README, encoding="utf-8").read()
  match = re.search(
    r"<!-- tested: tests/layers/test_readme_examples.py runs "
    r"this block -->\n```python\n(.*?)```",
    text,
    re.S,
  )
  assert match, "README lost its tested Keras example block"
  return match.group(1)


def test_readme_ranking_model_trains_its_tables_with_fit():
  namespace = {}
  exec(compile(readme_model_block(), "README.md", "exec"), namespace)  # pylint: disable=exec-used
  rng = np.random.default_rng(0)
  n = 512
  users, movies = rng.integers(1, 944, n), rng.integers(1, 1683, n)
  ratings = tf.data.Dataset.from_tensor_slices(
    {
      "user_id": users,
      "movie_id": movies,
      "user_rating": ((users % 5) + 1).astype("float32"),
    }
  )
  model = namespace["RankingModel"]()
  model.compile(optimizer=tf.keras.optimizers.Adagrad(learning_rate=0.1))
  model.fit(ratings.batch(128).take(1), verbose=0)  # builds the layers
  before = {
    c.name: v.numpy() for c, v in model.embedding.embedding_tables.items()
  }
  history = model.fit(ratings.batch(128), epochs=3, verbose=0)
  losses = history.history["loss"]
  assert losses[-1] < losses[0]
  for c, var in model.embedding.embedding_tables.items():
    assert not np.allclose(var.numpy(), before[c.name]), c.name
