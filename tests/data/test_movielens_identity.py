"""MovieLens' datasets stay bit-identical across refactorings.

A small generated ml-100k folder is read in five settings (random, temporal
and file splits; ranking and retrieval; every side feature, both histories
and timestamp buckets). The vocab sizes, split sizes, the first batches of
training (shuffled) and evaluation, the first batch of candidates and the
serving parser's untrained ids are hashed. The digests were computed with
the code before `MovieLens.__init__` became read -> encode -> split ->
features (run this file as a script to print them; three runs agreed); the
same seed must give the same bytes.
"""

import hashlib
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from recsys.data import MovieLens
from recsys.data.user_history import ItemHistory, UserHistory
from recsys.testing.movielens import write_ml100k_like

ALL = [
  "user_id",
  "user_age",
  "user_gender",
  "user_occupation",
  "user_zip",
  "item_id",
  "item_genres",
  "item_year",
  "item_title",
]

SETTINGS = {
  "ranking_random": dict(
    features=ALL,
    timestamp_buckets=4,
    history=UserHistory(weights="rating", max_length=7),
    item_history=ItemHistory(weights="recency", half_life=3, max_length=5),
    seed=3,
  ),
  "ranking_temporal": dict(split="temporal", test_fraction=0.25, seed=1),
  "retrieval_random": dict(
    task="retrieval",
    min_rating=3.0,
    features=ALL,
    history=UserHistory(),
    seed=5,
  ),
  "retrieval_temporal_unshuffled": dict(
    task="retrieval", split="temporal", shuffle=False, timestamp_buckets=3
  ),
  "ranking_files": dict(split="files", fold="u1", rating_scale=None),
}

EXPECTED = {
  "ranking_random": (
    "f2a9bb60ac96af2d8a6ced52629a6ba5ef1b97965cf65d2f2864eb474bdf484b"
  ),
  "ranking_temporal": (
    "aef7d922e877562c5600b11f950b227355943f7b4a73781c5c8c69df264c4d1b"
  ),
  "retrieval_random": (
    "0e5015ac46f424932c2e361f7db7a16ef8aafea0e2c18cb3380195d1cc2a0192"
  ),
  "retrieval_temporal_unshuffled": (
    "b8316447e44e3024b80db12fbe5abdd4f01e232f3f3efdb048272ad26fe54048"
  ),
  "ranking_files": (
    "3afad4402169a124571959269a09ae7a9246acd9c432ca86be4db7902511b987"
  ),
}


def write_folder(folder: str) -> str:
  """A small ml-100k folder with a u1.base / u1.test fold of its u.data."""
  write_ml100k_like(folder, num_users=40, num_items=60, num_ratings=900, seed=7)
  with open(os.path.join(folder, "u.data"), encoding="latin-1") as f:
    lines = f.readlines()
  cut = len(lines) * 4 // 5
  for name, part in (("u1.base", lines[:cut]), ("u1.test", lines[cut:])):
    with open(os.path.join(folder, name), "w", encoding="latin-1") as f:
      f.writelines(part)
  return folder


def _arrays(structure) -> list[np.ndarray]:
  """Every array of a batch, ragged tensors as values and row splits."""
  out = []
  for value in tf.nest.flatten(structure, expand_composites=True):
    out.append(np.asarray(value.numpy() if hasattr(value, "numpy") else value))
  return out


def digest(folder: str, setting: str) -> str:
  """sha256 of what `setting` builds from `folder` (see module docstring)."""
  source = MovieLens(folder, variant="ml-100k", **SETTINGS[setting])
  parts: list = [
    [
      (s.name, s.vocabulary_size, s.max_ids, s.weighted, s.table)
      for s in source.feature_specs
    ],
    (source.num_users, source.num_items, source.train_size, source.test_size),
    (source.query_features, source.candidate_features),
  ]
  arrays = []
  for training in (True, False):
    batches = source.dataset(16, training=training, repeat=False)
    for batch in batches.take(3):
      arrays += _arrays(batch)
  if source.task == "retrieval":
    arrays += _arrays(next(iter(source.candidates(32))))
  raw_ids = tf.constant([str(i) for i in range(0, 62)])  # "0", "61": unknown
  unknown = source.raw_parser().unknown(
    {"user_id": raw_ids, "item_id": raw_ids}
  )
  arrays += _arrays(unknown)
  h = hashlib.sha256(repr(parts).encode())
  for a in arrays:
    h.update(f"{a.dtype}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return write_folder(str(tmp_path_factory.mktemp("ml100k_like")))


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_datasets_are_bit_identical_to_the_pinned_digests(folder, setting):
  assert digest(folder, setting) == EXPECTED[setting]


if __name__ == "__main__":  # prints the digests to pin
  import tempfile

  with tempfile.TemporaryDirectory() as tmp:
    where = write_folder(tmp)
    for name in sorted(SETTINGS):
      print(f'  "{name}": "{digest(where, name)}",', file=sys.stdout)
