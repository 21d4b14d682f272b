"""A fixed MovieLens train/test split given as files, used as given.

Researchers compare on standard splits, not on a random one of their own:

  ml-100k  GroupLens' folds `u1.base` / `u1.test` (... `u5`, `ua`, `ub`)
           next to `u.item` and `u.user` (`fold=` picks one).
  atomic   RecBole's benchmark files `<name>.train.inter` and
           `<name>.test.inter` (a `<name>.valid.inter` is not used), with the
           optional `<name>.user` / `<name>.item`.

Both files' ratings go into one `RawMovieLens` (so ids share one vocabulary)
with a boolean `is_test` per rating.

Example:
  >>> raw, is_test = read("/data/ml-100k", "ml-100k", fold="u1")
"""

import glob
import logging
import os
from collections.abc import Sequence

import numpy as np

from recsys.data.errors import DatasetNotFoundError
from recsys.data.movielens import files

log = logging.getLogger("recsys.data.movielens")

FOLDS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")


def _joined(
  train: files.RawMovieLens,
  test: files.RawMovieLens,
  users,
  items,
  folder: str,
  item_info=None,
  metadata_files: Sequence[str] = (),
) -> tuple[files.RawMovieLens, np.ndarray]:
  origins = None
  if train.origins is not None and test.origins is not None:
    origins = files.RatingOrigins.joined([train.origins, test.origins])
  raw = files.RawMovieLens(
    np.concatenate([train.user, test.user]),
    np.concatenate([train.item, test.item]),
    np.concatenate([train.rating, test.rating]),
    np.concatenate([train.timestamp, test.timestamp]),
    users,
    items,
    folder,
    dict(item_info or {}),
    origins,
    list(dict.fromkeys(train.files + test.files + list(metadata_files))),
  )
  is_test = np.concatenate(
    [np.zeros(len(train.user), bool), np.ones(len(test.user), bool)]
  )
  return raw, is_test


def _read_100k_fold(
  data_dir: str, fold: str
) -> tuple[files.RawMovieLens, np.ndarray]:
  if fold not in FOLDS:
    raise ValueError(
      f"unknown ml-100k fold {fold!r}; GroupLens ships {', '.join(FOLDS)}."
    )
  folder = files.find_folder(data_dir, "ml-100k")
  base, test = f"{fold}.base", f"{fold}.test"
  if folder is None or not all(
    os.path.isfile(os.path.join(folder, f)) for f in (base, test)
  ):
    raise DatasetNotFoundError(
      files.missing_message(
        "ml-100k",
        data_dir,
        f"split='files' needs {base} and {test} next to u.item and "
        "u.user (they come in GroupLens' ml-100k.zip)",
      )
    )
  meta = files.read_100k(folder, ratings_file=None)
  parts = []
  for name in (base, test):
    path = os.path.join(folder, name)
    user, item, rating, ts, origins = files.read_ratings(path, "\t")
    part = files.RawMovieLens(
      user,
      item,
      rating,
      ts,
      meta.users,
      meta.items,
      folder,
      {},
      origins,
      [path],
    )
    files.check_ratings(part, path)
    parts.append(part)
  return _joined(
    parts[0],
    parts[1],
    meta.users,
    meta.items,
    folder,
    meta.item_info,
    meta.files,
  )


def _read_atomic_benchmark(
  data_dir: str, name: str | None
) -> tuple[files.RawMovieLens, np.ndarray]:
  for folder in [data_dir] + ([os.path.join(data_dir, name)] if name else []):
    found = sorted(
      glob.glob(os.path.join(folder, f"{name or '*'}.train.inter"))
    )
    if found:
      break
  if len(found) != 1:
    raise DatasetNotFoundError(
      files.missing_message(
        "atomic",
        data_dir,
        f"split='files' needs one <name>.train.inter and "
        f"<name>.test.inter (RecBole's benchmark files); found {len(found)} "
        "*.train.inter" + ("" if name else " (pass dataset_name= to choose)"),
      )
    )
  folder = os.path.dirname(found[0])
  name = os.path.basename(found[0])[: -len(".train.inter")]
  if not os.path.isfile(os.path.join(folder, f"{name}.test.inter")):
    raise DatasetNotFoundError(
      files.missing_message(
        "atomic",
        folder,
        f"{name}.train.inter has no {name}.test.inter beside it",
      )
    )
  if os.path.isfile(os.path.join(folder, f"{name}.valid.inter")):
    log.info(
      "%s.valid.inter is not used: training on %s.train.inter, evaluating on "
      "%s.test.inter",
      name,
      name,
      name,
    )
  parts = []
  for split in ("train", "test"):
    part = files.read_atomic(folder, f"{name}.{split}")
    files.check_ratings(part, os.path.join(folder, f"{name}.{split}.inter"))
    parts.append(part)
  users, items = files.atomic_metadata(folder, name)
  info = files.atomic_item_info(folder, name)
  return _joined(
    parts[0],
    parts[1],
    users,
    items,
    folder,
    info,
    files.atomic_metadata_files(folder, name),
  )


def read(
  data_dir: str, variant: str, name: str | None = None, fold: str = "u1"
) -> tuple[files.RawMovieLens, np.ndarray]:
  """Both files of a fixed split: `(ratings of train then test, is_test)`.

  Raises:
    DatasetNotFoundError: the split's files are missing (names them).
    ValueError: a variant without split files (ml-1m), or an unknown fold.
    DataFormatError: a file does not parse (names file and line).
  """
  if variant == "ml-100k":
    return _read_100k_fold(data_dir, fold)
  if variant == "atomic":
    return _read_atomic_benchmark(data_dir, name)
  raise ValueError(
    f"MovieLens {variant} ships no train/test split files; split='files' "
    "reads ml-100k's u1.base/u1.test or RecBole's <name>.train.inter/"
    "<name>.test.inter. Use split='random' or 'temporal'."
  )
