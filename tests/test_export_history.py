"""Export of a model with the history features: raw ids serve like ids."""

import numpy as np
import pytest

from tests.test_export_raw import (
  _first_nine,
  _train_and_export,
  _train_on_ml100k,
)


@pytest.mark.slow  # trains (2 steps), exports the FM with weighted histories
def test_history_is_served_from_the_raw_user_id(tmp_path, serving_process):
  _, model_dir, export_dir = _train_on_ml100k(
    tmp_path,
    "movielens_fm.gin",
    [
      "UserHistory.weights = 'rating'",
      "ItemHistory.weights = 'rating'",  # movielens_fm.gin adds it
      "EmbeddingSettings.dim = 5",
      # Ids and the history only: each side feature's tables and raw
      # signatures cost tracing time and are covered by test_export_raw.
      "MovieLens.features = ['user_id', 'item_id']",
      "FactorizationMachine.user_features = ['user_id', 'user_history']",
    ],
  )
  source, features, specs, ids = _first_nine(model_dir)
  assert specs["user_history"].weighted and specs["item_history"].weighted
  for name in ("user_history", "item_history"):
    weights = features["weights"][name].to_tensor(
      shape=[None, specs[name].max_ids]
    )
    ids[f"{name}_weights"] = weights.numpy()
  # Raw ids by the documented rule: raw ids sorted numerically -> 1, 2, 3.
  raw = {
    "user_id": np.array(["", "1", "2", "10"])[ids["user_id"]],
    "item_id": np.array(["", "1", "2", "3"])[ids["item_id"]],
  }
  got = serving_process.serve(
    tmp_path,
    export_dir,
    {"ids": ("serving_default", ids), "raw": ("serving_raw", raw)},
  )
  np.testing.assert_allclose(
    got["raw"]["scores"], got["ids"]["scores"], rtol=1e-5
  )


def _seen_sets(source):
  """Each user id's training items, read from the training split."""
  seen = {}
  for features, _ in source.dataset(
    64, training=True, repeat=False, drop_remainder=False
  ):
    pairs = zip(
      features["categorical"]["user_id"].numpy(),
      features["categorical"]["item_id"].numpy(),
    )
    for user, item in pairs:
      seen.setdefault(int(user), set()).add(int(item))
  return seen


@pytest.mark.slow  # trains a two-tower with history 2 steps, exports it
def test_top_k_for_a_raw_user_id_with_and_without_seen_items(
  tmp_path,
  serving_process,
):
  """ "top_k_raw" on the raw user id alone, served without the project,
  returns the evaluation's ranking: the corpus top-k, or the top-k of the
  items the user did not rate in training (`CorpusIndex.
  query_with_exclusions`, the ranking `exclude_seen` evaluation uses)."""
  from recsys.run import restored as restored_lib  # noqa: PLC0415
  from recsys.testing.movielens import write_ml100k_like  # noqa: PLC0415

  data = write_ml100k_like(
    str(tmp_path / "ml"), num_users=12, num_items=17, num_ratings=120
  )
  model_dir, export_dir = _train_and_export(
    tmp_path,
    "movielens_retrieval_history.gin",
    [
      f"MOVIELENS_DIR = '{data}'",
      "MovieLens.variant = 'ml-100k'",
      "MovieLens.features = ['user_id', 'item_id']",
      "TwoTower.query_tower = (5,)",
      "TwoTower.candidate_tower = (5,)",
    ],
  )
  from recsys import config  # noqa: PLC0415
  from recsys.training import train  # noqa: PLC0415

  config.parse(
    [f"{model_dir}/operative_config.gin"],
    ["train.progress_bar = False", "train.summaries = False"],
  )
  trainer = train(model_dir=model_dir, action="build")
  source, model = trainer.run.source, trainer.model
  assert "user_history" in model.query_features
  raw_users = np.array(
    [str(u) for u in range(1, 13)] + ["4242"]  # the last one is unknown
  )
  parsed = source.raw_parser().parse_raw(
    {"user_id": raw_users}, model.query_features
  )
  embed = restored_lib.embed_fn(
    trainer.backend, model.query_embeddings, model.query_features
  )
  queries = embed(parsed)
  trainer.run.index_corpus()
  seen = _seen_sets(source)
  user_ids = parsed["categorical"]["user_id"].numpy()
  width = max(len(s) for s in seen.values())
  exclusions = np.full((len(user_ids), width), -1, np.int64)
  for row, user in enumerate(user_ids):
    items = sorted(seen.get(int(user), ()))
    exclusions[row, : len(items)] = items
  want = {
    False: model.corpus_index(queries, k=17),
    True: model.corpus_index.query_with_exclusions(queries, exclusions, k=17),
  }
  got = serving_process.serve(
    tmp_path,
    export_dir,
    {
      f"excluded_{flag}": (
        "top_k_raw",
        {"user_id": raw_users, "exclude_seen": np.full(13, flag)},
      )
      for flag in (False, True)
    },
  )
  for flag, (scores, ids) in want.items():
    out = got[f"excluded_{flag}"]
    np.testing.assert_array_equal(out["candidate_ids"], ids.numpy())
    real = ids.numpy() >= 0
    np.testing.assert_allclose(
      out["scores"][real], scores.numpy()[real], rtol=1e-5
    )
    assert not np.isfinite(out["scores"][~real]).any()
    np.testing.assert_array_equal(
      out["candidate_raw_ids"].astype(str),
      np.where(real, ids.numpy().astype(str), ""),
    )
  # Excluding changes the answers of users who rated something, never
  # returns a rated item, and the unknown user ("4242", id 0) sees nothing.
  excluded = got["excluded_True"]["candidate_ids"]
  for row, user in enumerate(user_ids):
    assert not set(excluded[row].tolist()) & seen.get(int(user), set())
  assert got["excluded_True"]["unknown_user_id"].tolist() == [False] * 12 + [
    True
  ]
  np.testing.assert_array_equal(
    excluded[-1], got["excluded_False"]["candidate_ids"][-1]
  )
