"""The README's Keras and Trainer examples run, learn, and run again.

The model block is taken from README.md as written and trained with `fit`
on synthetic MovieLens-shaped data: the tables must move (trained by the
embedding optimizer, not left alone) and the loss must fall. The examples
as written must learn their planted signal, well below predicting the mean
(they used to end at the mean's RMSE), and the Trainer example must work
when a reader runs it a second time (it used to raise a KeyError).
"""

import json
import logging
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


def readme_python_block(containing: str) -> str:
  """The README's one python block that contains `containing`."""
  text = open(README, encoding="utf-8").read()
  found = [
    block
    for block in re.findall(r"```python\n(.*?)```", text, re.S)
    if containing in block
  ]
  assert len(found) == 1, (
    f"README: {len(found)} python blocks with {containing!r}"
  )
  return found[0]


def test_readme_keras_example_learns_its_planted_signal():
  namespace = {"__name__": "__main__"}
  for block in (readme_model_block(), readme_python_block("model.fit(")):
    exec(compile(block, "README.md", "exec"), namespace)  # pylint: disable=exec-used
  rmse = namespace["result"]["root_mean_squared_error"]
  predicting_the_mean = namespace["stars"][80_000:].std()
  assert predicting_the_mean > 1.0
  assert rmse < 0.6 * predicting_the_mean


def test_readme_trainer_example_learns_and_runs_again(
  tmp_path, monkeypatch, caplog
):
  monkeypatch.chdir(tmp_path)
  code = compile(readme_python_block("Trainer("), "README.md", "exec")
  first = {"__name__": "__main__"}
  exec(code, first)  # pylint: disable=exec-used
  rmse = first["metrics"]["eval/rmse"]
  assert rmse < 0.5 * first["labels"][16_000:].std()
  path = tmp_path / "runs" / "my_model" / "metrics.json"
  written = json.loads(path.read_text())
  assert "train/loss" in written and "examples_per_second_steady" in written

  second = {"__name__": "__main__"}  # the reader runs the script again
  with caplog.at_level(logging.WARNING, "recsys.training"):
    exec(code, second)  # pylint: disable=exec-used
  assert "nothing to train" in caplog.text
  again = second["metrics"]
  assert again["steps_trained"] == 0 and again["step"] == 200
  np.testing.assert_allclose(again["eval/rmse"], rmse, rtol=1e-5)
  assert json.loads(path.read_text()) == written  # the first run's figures
