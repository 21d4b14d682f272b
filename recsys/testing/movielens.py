"""MovieLens-like ratings with planted effects, in ml-100k's file layout.

For tests and for `recsys benchmark movielens --synthetic` where the real
files are not at hand. `write_ml100k_like(folder)` writes u.data, u.item
and u.user (the GroupLens layout `recsys.data.movielens.files` reads) whose
ratings are

  rating = clip(round(mu + b_u + b_i + side + taste + noise), 1, 5)

  b_u, b_i   user and item biases (normal; items also vary in popularity)
  side       a planted age x genre and gender x genre effect
  taste      `history_effect` if the item is in the user's favourite item
             cluster, else 0; users also pick `cluster_share` of the movies
             they rate from that cluster, so WHICH movies a user rated (the
             history feature) reveals the taste, as it does in real data.

Everything is seeded; no real MovieLens data is involved.
"""

import os

import numpy as np

from recsys.data.movielens.files import ML100K_GENRES

OCCUPATIONS = (
  "administrator",
  "artist",
  "educator",
  "engineer",
  "librarian",
  "other",
  "programmer",
  "student",
  "technician",
  "writer",
)
WORDS = (
  "love night story man day dark last return city house war blue king "
  "island star dead life secret game lost big little money river heart"
).split()


def write_ml100k_like(
  folder: str,
  num_users: int = 943,
  num_items: int = 1682,
  num_ratings: int = 100_000,
  num_clusters: int = 8,
  cluster_share: float = 0.6,
  history_effect: float = 0.8,
  noise: float = 0.7,
  seed: int = 0,
) -> str:
  """Writes u.data, u.item, u.user into `folder` (created); returns it.

  Args:
    folder: where the files go.
    num_users, num_items, num_ratings: sizes (each user rates each movie at
      most once; users rate at least 5 movies).
    num_clusters: item clusters (user tastes).
    cluster_share: share of a user's movies from the favourite cluster.
    history_effect: rating bonus for movies of the favourite cluster.
    noise: rating noise sd before rounding.
    seed: the generator's seed.
  """
  rng = np.random.default_rng(seed)
  os.makedirs(folder, exist_ok=True)
  ages = rng.integers(15, 70, num_users)
  genders = rng.choice(["M", "F"], num_users, p=[0.7, 0.3])
  occupations = rng.choice(OCCUPATIONS, num_users)
  zips = [f"{z:05d}" for z in rng.integers(0, 99999, num_users)]
  favourite = rng.integers(0, num_clusters, num_users)
  b_u = rng.normal(0, 0.35, num_users)
  activity = rng.lognormal(0, 0.8, num_users)
  activity /= activity.sum()

  cluster = rng.integers(0, num_clusters, num_items)
  b_i = rng.normal(0, 0.4, num_items)
  popularity = rng.pareto(1.2, num_items) + 0.05
  years = rng.integers(1930, 1999, num_items)
  genre_flags = rng.random((num_items, len(ML100K_GENRES))) < 0.12
  genre_flags[np.arange(num_items), 1 + cluster % (len(ML100K_GENRES) - 1)] = 1
  genre_flags[:, 0] = 0
  # Side effects: older users like genre 8 (Drama), women genre 14 (Romance).
  genre_age = np.zeros(len(ML100K_GENRES))
  genre_age[8] = 0.4
  genre_gender = np.zeros(len(ML100K_GENRES))
  genre_gender[14] = 0.4

  per_user = np.maximum(5, np.round(activity * num_ratings).astype(int)).clip(
    max=num_items // 2
  )
  rows = []
  base = popularity / popularity.sum()
  for u in range(num_users):
    n = int(per_user[u])
    in_cluster = cluster == favourite[u]
    p = base * np.where(in_cluster, 1.0, 0.0)
    q = base * np.where(in_cluster, 0.0, 1.0)
    mix = cluster_share * p / max(p.sum(), 1e-12) + (1 - cluster_share) * (
      q / max(q.sum(), 1e-12)
    )
    items = rng.choice(num_items, size=n, replace=False, p=mix / mix.sum())
    for i in items:
      side = genre_age @ genre_flags[i] * (
        1.0 if ages[u] >= 35 else -1.0
      ) + genre_gender @ genre_flags[i] * (1.0 if genders[u] == "F" else -1.0)
      taste = history_effect if cluster[i] == favourite[u] else 0.0
      value = 3.5 + b_u[u] + b_i[i] + side + taste + rng.normal(0, noise)
      rating = int(np.clip(np.round(value), 1, 5))
      stamp = 874_724_710 + int(rng.integers(0, 20_000_000))
      rows.append(f"{u + 1}\t{i + 1}\t{rating}\t{stamp}\n")
  order = rng.permutation(len(rows))
  with open(os.path.join(folder, "u.data"), "w", encoding="latin-1") as f:
    f.writelines(rows[k] for k in order)
  with open(os.path.join(folder, "u.user"), "w", encoding="latin-1") as f:
    for u in range(num_users):
      f.write(f"{u + 1}|{ages[u]}|{genders[u]}|{occupations[u]}|{zips[u]}\n")
  with open(os.path.join(folder, "u.item"), "w", encoding="latin-1") as f:
    for i in range(num_items):
      words = " ".join(
        w.title() for w in rng.choice(WORDS, int(rng.integers(1, 4)))
      )
      flags = "|".join(str(int(x)) for x in genre_flags[i])
      f.write(
        f"{i + 1}|{words} ({years[i]})|01-Jan-{years[i]}||"
        f"http://example.com/{i + 1}|{flags}\n"
      )
  return folder


__all__ = ["write_ml100k_like"]
