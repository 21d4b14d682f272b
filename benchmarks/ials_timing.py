"""Seconds per epoch of ImplicitALS through an embedding backend.

Reads a MovieLens folder (`--data_dir`: GroupLens u.data or RecBole
atomic files) or writes the synthetic ml-100k-like files
(`recsys.testing.movielens`), takes every (user, movie) rating as a positive
pair, and trains `recsys.models.retrieval.ials.ImplicitALS` the way a Trainer step
does (lookup under a tape, the model's loss, the backend's SGD(1.0)
update) in a compiled `tf.function` per batch. Prints the seconds of each
epoch after a first, tracing one, the NumPy iALS's
(`benchmarks/movielens_baselines.py`) seconds per epoch on the same
pairs, and the largest difference between the two's tables from the same
initial values.

  PYTHONPATH=. python benchmarks/ials_timing.py --epochs 3 --dim 32
  PYTHONPATH=. python benchmarks/ials_timing.py --data_dir data/ml-100k \
    --reg 0.02 --alpha 3 --reg_exponent 1
"""

import argparse
import tempfile
import time

import numpy as np

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from benchmarks import ials_scale
from benchmarks import movielens_baselines as baselines
from recsys.data import ials_batches, ials_dataset
from recsys.data.movielens import files as movielens_files
from recsys.testing import movielens


def _pairs(folder: str) -> tuple[np.ndarray, int, int]:
  """(user, item) ids `[n, 2]` (ids 1.., raw ids in sorted order), and the
  numbers of users and items, of the MovieLens files in `folder`."""
  variant = movielens_files.detect_variant(folder)
  if variant is None:
    raise SystemExit(f"no MovieLens files (u.data or *.inter) in {folder!r}")
  raw = movielens_files.read(folder, variant)
  ids = []
  for values in (raw.user, raw.item):
    _, index = np.unique(values.astype(str), return_inverse=True)
    ids.append(index.astype(np.int64) + 1)
  return np.stack(ids, 1), int(ids[0].max()), int(ids[1].max())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--dim", type=int, default=32)
  parser.add_argument("--batch_size", type=int, default=256)
  parser.add_argument("--reg", type=float, default=100.0)
  parser.add_argument("--alpha", type=float, default=10.0)
  parser.add_argument("--reg_exponent", type=float, default=0.0)
  parser.add_argument(
    "--data_dir",
    default=None,
    help="a MovieLens folder (default: synthetic ml-100k-like files)",
  )
  parser.add_argument(
    "--history_chunk",
    type=int,
    default=None,
    help="cut histories into chunks of this many ids (default: none, "
    "every history padded to the longest)",
  )
  args = parser.parse_args()

  if args.data_dir:
    pairs, num_users, num_items = _pairs(args.data_dir)
  else:
    with tempfile.TemporaryDirectory() as folder:
      pairs, num_users, num_items = _pairs(movielens.write_ml100k_like(folder))
  users, items = num_users + 1, num_items + 1
  specs = ials_batches.feature_specs(
    pairs,
    users,
    items,
    history_chunk=args.history_chunk,
  )
  backend, step = ials_scale.ials_training(
    specs, args.dim, args.reg, args.alpha, reg_exponent=args.reg_exponent
  )

  batches = list(
    ials_dataset.epoch_batches(
      pairs, users, items, args.batch_size, history_chunk=args.history_chunk
    )
  )
  tables = {t.name: v for t, v in backend.embedding_tables.items()}
  p0, q0 = tables["user"].numpy(), tables["item"].numpy()
  seconds = []
  for _ in range(args.epochs + 1):  # the first epoch traces
    start = time.perf_counter()
    for features, labels in batches:
      step(features, labels)
    seconds.append(time.perf_counter() - start)

  unique = ials_batches.unique_pairs(pairs, users, items)
  by_user = baselines._rows_by_key(unique[:, 0], unique[:, 1], users)
  by_item = baselines._rows_by_key(unique[:, 1], unique[:, 0], items)
  p, q = p0, q0
  start = time.perf_counter()
  weights = (args.reg, args.alpha, 1.0, args.reg_exponent)
  for _ in range(args.epochs + 1):
    p = baselines._ials_half_step(q, by_user, *weights)
    q = baselines._ials_half_step(p, by_item, *weights)
  numpy_seconds = (time.perf_counter() - start) / (args.epochs + 1)
  diff = max(
    np.abs(tables["user"].numpy() - p).max(),
    np.abs(tables["item"].numpy() - q).max(),
  )
  print(
    f"{args.data_dir or 'synthetic ml-100k-like'}: {users} user rows, "
    f"{items} item rows, "
    f"{len(unique)} pairs, dim {args.dim}, batch {args.batch_size}, "
    f"history_chunk {args.history_chunk}, {len(batches)} steps per epoch"
  )
  print(f"first epoch (tracing): {seconds[0]:.2f} s")
  print(
    "ImplicitALS seconds per epoch: "
    + ", ".join(f"{s:.2f}" for s in seconds[1:])
  )
  print(f"NumPy iALS seconds per epoch: {numpy_seconds:.2f}")
  print(f"largest |table - NumPy| after {args.epochs + 1} epochs: {diff:.2e}")


if __name__ == "__main__":
  main()
