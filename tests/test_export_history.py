"""Export of a model with the history features: raw ids serve like ids."""

import numpy as np
import pytest

from tests.test_export_raw import (  # noqa: F401  (server is a fixture)
  _ml100k,
  _padded,
  _source,
  _train_and_export,
  server,
)


@pytest.mark.slow  # trains (2 steps), exports the FM with weighted histories
def test_history_is_served_from_the_raw_user_id(tmp_path, server):  # noqa: F811
  data, _ = _ml100k(tmp_path / "ml-100k")
  model_dir, export_dir = _train_and_export(
    tmp_path,
    "movielens_fm.gin",
    [
      f"MOVIELENS_DIR = '{data}'",
      "MovieLens.test_fraction = 0.25",
      "UserHistory.weights = 'rating'",
      "ItemHistory.weights = 'rating'",  # movielens_fm.gin adds it
      "EmbeddingSettings.dim = 5",
      # Ids and the history only: each side feature's tables and raw
      # signatures cost tracing time and are covered by test_export_raw.
      "MovieLens.features = ['user_id', 'item_id']",
      "FactorizationMachine.user_features = ['user_id', 'user_history']",
    ],
  )
  source = _source(model_dir)
  features, _ = next(
    iter(source.dataset(9, training=False, drop_remainder=False, repeat=False))
  )
  specs = {s.name: s for s in source.feature_specs}
  assert specs["user_history"].weighted and specs["item_history"].weighted
  ids = {
    n: _padded(v, specs[n].max_ids) for n, v in features["categorical"].items()
  }
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
  got = server.serve(
    tmp_path,
    export_dir,
    {"ids": ("serving_default", ids), "raw": ("serving_raw", raw)},
  )
  np.testing.assert_allclose(
    got["raw"]["scores"], got["ids"]["scores"], rtol=1e-5
  )
