"""The raw-feature parser: raw values -> the contract's `features`, in TF ops.

A file-backed source (Criteo, MovieLens) turns raw values (hex strings,
integer counts as text, user and item ids as they appear in the files) into
model inputs by hashing, vocabulary lookup and normalisation. That
transformation lives in one `RawParser` per source, written in TF ops, and
both the source's own reader and the export's raw serving signature call
it, so training and serving cannot drift apart. A parser is a `tf.Module`:
the vocabulary tables it owns are saved with the SavedModel that holds it.

Synthetic sources have no raw form, so they have no parser
(`DataSource.raw_parser()` returns None) and their exports have no raw
signature.
"""

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf


class RawParser(tf.Module, abc.ABC):
  """Raw values of one source -> `features` (the contract: `recsys.data`).

  Subclasses say which raw inputs the model features need
  (`raw_feature_spec`), transform them (`parse_raw`), and flag raw ids that
  are not in a vocabulary (`unknown`), which map to the reserved id 0.
  """

  @abc.abstractmethod
  def raw_feature_spec(
    self, feature_names: Sequence[str], dense: bool = False
  ) -> dict[str, tf.TensorSpec]:
    """The raw inputs `[B]` (a tensor per raw column) that `feature_names` need.

    Args:
      feature_names: categorical features in `features["categorical"]`.
      dense: also the raw columns of `features["dense"]`.
    """

  @abc.abstractmethod
  def parse_raw(
    self, raw: Mapping[str, tf.Tensor], feature_names: Sequence[str]
  ) -> dict[str, Any]:
    """`features` (`"categorical"` of `feature_names`, `"dense"` if its raw
    columns are in `raw`) from raw values `[B]` keyed as `raw_feature_spec`."""

  def unknown(self, raw: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Raw input name -> bool `[B]`, True where a non-empty raw id is not in
    the vocabulary (mapped to id 0). Empty: every value maps to a real id."""
    del raw
    return {}

  def raw_ids(self, feature_name: str, ids: tf.Tensor) -> tf.Tensor | None:
    """The raw values (strings) of `feature_name`'s ids, or None if unknown."""
    del feature_name, ids
    return None


__all__ = ["RawParser"]
