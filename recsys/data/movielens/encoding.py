"""MovieLens' encode step: raw ids and side data -> contiguous integer ids.

`MovieLens` reads a folder (`files`) and encodes it once here:
vocabularies over every id in the files (an id map, not a statistic, so
both splits share it) and the per-user and per-item side tables that
`MovieLensRawParser` gathers from, in training and in serving alike. Id 0
is reserved for unknown everywhere.

Example:
  >>> vocab = encode(movielens_files.read("/data/ml-100k", "ml-100k"))
  >>> vocab.num_users, vocab.vocab_sizes(timestamp_buckets=0)["item_id"]
  (943, 1683)
"""

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from recsys.data.movielens.files import RawMovieLens

AGE_BOUNDARIES = (18, 25, 35, 45, 50, 56)
USER_SIDE_FEATURES = ("user_age", "user_gender", "user_occupation", "user_zip")

#: `(values, lengths)`: one bag of ids per row, concatenated.
Bags = tuple[np.ndarray, np.ndarray]


def sorted_vocab(values: Iterable[str]) -> list[str]:
  """Distinct values sorted, numerically when every one is a number."""
  out = sorted(set(values))
  if out and all(v.isdigit() for v in out):
    out.sort(key=int)
  return out


def title_tokens(title: str) -> list[str]:
  """Lower-case words: "Usual Suspects, The" -> [usual, suspects, the]."""
  return re.findall(r"[a-z0-9]+", title.lower())


def age_bucket(age: str) -> int:
  """1..7 by ml-1m's age groups (<18, 18-24, ..., 56+); 0: not a number."""
  try:
    value = float(age)
  except ValueError:
    return 0
  return 1 + int(np.searchsorted(AGE_BOUNDARIES, value, side="right"))


def _index(vocab: Sequence[str]) -> dict[str, int]:
  return {v: i + 1 for i, v in enumerate(vocab)}


def _bag_arrays(bags: Sequence[Sequence[int]]) -> Bags:
  values = np.concatenate([np.array(b, np.int64) for b in bags])
  return values, np.array([len(b) for b in bags], np.int64)


@dataclasses.dataclass(frozen=True)
class MovieLensVocabularies:
  """The id maps and side tables of one MovieLens folder.

  Attributes:
    users, items: raw ids sorted (numerically if numeric); id = index + 1.
    occupations, zips: user occupations and zip prefixes, sorted.
    user_side: user_age / gender / occupation / zip -> `[num_users + 1]` ids.
    genres: genre names sorted (item_genres id = index + 1).
    genre_bags: each item's genre ids (row 0 and genre-less items: `[0]`).
    years: release years sorted; item_year: `[num_items + 1]` their ids.
    title_vocab: title words in >= title_min_count titles, sorted.
    title_bags: each item's title word ids (none: `[0]`).
  """

  users: list[str]
  items: list[str]
  occupations: list[str]
  zips: list[str]
  user_side: dict[str, np.ndarray]
  genres: list[str]
  genre_bags: Bags
  years: list[str]
  item_year: np.ndarray
  title_vocab: list[str]
  title_bags: Bags

  @property
  def num_users(self) -> int:
    return len(self.users)

  @property
  def num_items(self) -> int:
    return len(self.items)

  def vocab_sizes(self, timestamp_buckets: int) -> dict[str, int]:
    """Feature name -> vocabulary size (0 included), histories too."""
    return {
      "user_id": self.num_users + 1,
      "item_id": self.num_items + 1,
      "user_age": len(AGE_BOUNDARIES) + 2,
      "user_gender": 3,
      "user_occupation": len(self.occupations) + 1,
      "user_zip": len(self.zips) + 1,
      "item_genres": len(self.genres) + 1,
      "timestamp": int(timestamp_buckets) + 1,
      "item_year": len(self.years) + 1,
      "item_title": len(self.title_vocab) + 1,
      "user_history": self.num_items + 1,
      "item_history": self.num_users + 1,
    }


def _user_side(
  users: Mapping[str, Mapping[str, str]],
  user_vocab: Sequence[str],
  zip_prefix_length: int,
) -> tuple[list[str], list[str], dict[str, np.ndarray]]:
  """(occupations, zip prefixes, the side tables) of the users' metadata."""
  side = {
    name: np.zeros(len(user_vocab) + 1, np.int64) for name in USER_SIDE_FEATURES
  }
  occupations = sorted_vocab(
    u["occupation"] for u in users.values() if u["occupation"]
  )
  zips = sorted_vocab(
    u["zip"][:zip_prefix_length] for u in users.values() if u["zip"]
  )
  occ_index, zip_index = _index(occupations), _index(zips)
  user_index = _index(user_vocab)
  for uid, info in users.items():
    row = user_index[uid]
    side["user_age"][row] = age_bucket(info["age"])
    side["user_gender"][row] = {"M": 1, "F": 2}.get(info["gender"].upper(), 0)
    side["user_occupation"][row] = occ_index.get(info["occupation"], 0)
    side["user_zip"][row] = zip_index.get(info["zip"][:zip_prefix_length], 0)
  return occupations, zips, side


def _genre_bags(
  items: Mapping[str, Sequence[str]], item_vocab: Sequence[str]
) -> tuple[list[str], Bags]:
  """(genres, each item's genre ids) of the items' metadata."""
  genres = sorted_vocab(g for gs in items.values() for g in gs)
  genre_index, item_index = _index(genres), _index(item_vocab)
  bags: list[list[int]] = [[0] for _ in range(len(item_vocab) + 1)]
  for iid, names in items.items():
    ids = sorted(genre_index[g] for g in set(names))
    bags[item_index[iid]] = ids or [0]
  return genres, _bag_arrays(bags)


def _item_years(
  item_info: Mapping[str, Mapping[str, str]], item_vocab: Sequence[str]
) -> tuple[list[str], np.ndarray]:
  """(release years, each item's year id) of the items' titles and dates."""
  years = sorted_vocab(v["year"] for v in item_info.values() if v["year"])
  year_index, item_index = _index(years), _index(item_vocab)
  item_year = np.zeros(len(item_vocab) + 1, np.int64)
  for iid, v in item_info.items():
    if iid in item_index:
      item_year[item_index[iid]] = year_index.get(v["year"], 0)
  return years, item_year


def _title_bags(
  item_info: Mapping[str, Mapping[str, str]],
  item_vocab: Sequence[str],
  title_min_count: int,
) -> tuple[list[str], Bags]:
  """(title words in >= title_min_count titles, each item's word ids)."""
  words = {
    iid: sorted(set(title_tokens(v["title"]))) for iid, v in item_info.items()
  }
  word_counts: dict[str, int] = {}
  for ws in words.values():
    for w in ws:
      word_counts[w] = word_counts.get(w, 0) + 1
  vocab = sorted(
    w for w, c in word_counts.items() if c >= max(int(title_min_count), 1)
  )
  word_index, item_index = _index(vocab), _index(item_vocab)
  bags: list[list[int]] = [[0] for _ in range(len(item_vocab) + 1)]
  for iid in item_info:
    if iid in item_index:
      ids = [word_index[w] for w in words[iid] if w in word_index]
      bags[item_index[iid]] = ids or [0]
  return vocab, _bag_arrays(bags)


def encode(
  raw: RawMovieLens, zip_prefix_length: int = 2, title_min_count: int = 2
) -> MovieLensVocabularies:
  """The vocabularies and side tables of every id in `raw` (both splits)."""
  users = sorted_vocab(list(raw.user) + list(raw.users))
  items = sorted_vocab(list(raw.item) + list(raw.items))
  occupations, zips, user_side = _user_side(raw.users, users, zip_prefix_length)
  genres, genre_bags = _genre_bags(raw.items, items)
  years, item_year = _item_years(raw.item_info, items)
  title_vocab, title_bags = _title_bags(raw.item_info, items, title_min_count)
  return MovieLensVocabularies(
    users,
    items,
    occupations,
    zips,
    user_side,
    genres,
    genre_bags,
    years,
    item_year,
    title_vocab,
    title_bags,
  )


__all__ = [
  "AGE_BOUNDARIES",
  "MovieLensVocabularies",
  "encode",
  "sorted_vocab",
  "title_tokens",
]
