"""MovieLens' raw ids: the files' user and item ids as int64 (dynamic tables).

With `MovieLens.raw_ids`, user_id and item_id are delivered as RAW ids
(`FeatureSpec.raw_ids`) instead of contiguous vocabulary ids, by one rule
per layout (`kind_of`):

  "integer"      GroupLens ml-100k and ml-1m: the id the files hold, read
                 as a decimal int64 ("196" -> 196). Every id must be one
                 (`check_integer_ids`), and two spellings of one number
                 ("7", "07") are refused: they would be one raw id for two
                 users.
  "fingerprint"  RecBole atomic files, whose ids are tokens (strings): the
                 64-bit fingerprint of the token, the int64 whose
                 little-endian bytes are `tf.fingerprint` of it (farmhash64,
                 the same on every platform and TF version). Any int64,
                 negative ones too; two of n distinct tokens share one with
                 odds about n^2 / 2^65 (1e-8 for a million tokens).

Surrounding whitespace is ignored, as the readers and the vocabularies
ignore it. `raw_ids` is a TF function, so the export's raw signature maps
a client's ids the same way the batches did.

Example:
  >>> raw_ids(["196", " 7"], "integer").numpy()
  array([196,   7])
"""

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from recsys.data.errors import DataFormatError
from recsys.data.movielens.files import RawMovieLens

KINDS = ("integer", "fingerprint")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64 = np.iinfo(np.int64)


def kind_of(variant: str) -> str:
  """The raw-id rule of a layout: "fingerprint" for RecBole's atomic files
  (token ids), "integer" for GroupLens' ml-100k and ml-1m."""
  return "fingerprint" if variant == "atomic" else "integer"


def fingerprint64(values: Any) -> tf.Tensor:
  """int64 `[N]` fingerprints of strings `[N]` (see the module docstring)."""
  values = tf.reshape(tf.convert_to_tensor(values, tf.string), [-1])
  digest = tf.cast(tf.fingerprint(values, method="farmhash64"), tf.int64)
  out = tf.zeros(tf.shape(values), tf.int64)
  for byte in range(8):  # little-endian, whatever the machine's order
    out = tf.bitwise.bitwise_or(
      out,
      tf.bitwise.left_shift(digest[:, byte], tf.constant(8 * byte, tf.int64)),
    )
  return out


def raw_ids(values: Any, kind: str) -> tf.Tensor:
  """Raw ids (int64 `[N]`) of the files' ids as strings `[N]`, by `kind`.

  Raises:
    ValueError: an unknown kind.
    tf.errors.InvalidArgumentError: with "integer", a value that is not a
      decimal int64 (the source checks the files' ids before:
      `check_integer_ids`).
  """
  values = tf.strings.strip(tf.convert_to_tensor(values, tf.string))
  if kind == "integer":
    return tf.strings.to_number(values, tf.int64)
  if kind == "fingerprint":
    return fingerprint64(values)
  raise ValueError(f"unknown raw id kind {kind!r}; valid: {', '.join(KINDS)}.")


def _is_int64(value: str) -> bool:
  return bool(_INTEGER.fullmatch(value)) and (
    _INT64.min <= int(value) <= _INT64.max
  )


def check_integer_ids(
  raw: RawMovieLens, vocabularies: dict[str, Sequence[str]]
) -> None:
  """Every user and item id is a decimal int64, one spelling per number.

  Args:
    raw: the files read (to name the file and line of a bad id).
    vocabularies: "user_id" / "item_id" -> every id of the files.

  Raises:
    DataFormatError: naming the id, where it is and `MovieLens.raw_ids`.
  """
  columns = {"user_id": raw.user, "item_id": raw.item}
  for name, vocab in vocabularies.items():
    bad = [v for v in vocab if not _is_int64(v.strip())]
    if bad:
      raise DataFormatError(
        f"MovieLens.raw_ids = True delivers {name} as the files' ids read "
        f"as int64, but {_where(raw, columns[name], bad[0])} holds "
        f"{name} {bad[0]!r}, not a decimal integer that fits int64 "
        f"({len(bad)} such id(s)). Fix the files, or leave raw_ids off "
        "(contiguous ids), or give the ratings as RecBole atomic files "
        "(tokens get 64-bit fingerprints)."
      )
    numbers: dict[int, str] = {}
    for v in vocab:
      other = numbers.setdefault(int(v.strip()), v)
      if other != v:
        raise DataFormatError(
          f"MovieLens.raw_ids = True: {name} {other!r} and {v!r} are "
          f"different ids in the files (different vocabulary entries) but "
          f"the same int64 {int(v)}; write each id one way, or leave "
          "raw_ids off."
        )


def _where(raw: RawMovieLens, column: np.ndarray, value: str) -> str:
  """The file and line of the first rating holding `value` (else the
  folder: a metadata file's id)."""
  hits = np.flatnonzero(column == value)
  if hits.size and raw.origins is not None:
    return raw.origins.where(int(hits[0]))
  return repr(raw.source)


__all__ = [
  "KINDS",
  "check_integer_ids",
  "fingerprint64",
  "kind_of",
  "raw_ids",
]
