"""Criteo's raw columns -> model inputs: one transformation, reader and serving.

`CriteoTSV` parses each chunk of TSV lines into columns of strings and hands
them to `CriteoRawParser.parse_raw`; the export's raw signature hands it the
columns a client sends. The conventions (those of the DLRM and MLPerf
references):

  * dense I1..I13: empty -> 0, negatives clipped to 0, then `log(1 + x)`;
    float32 `features["dense"]` `[B, 13]`.
  * categorical C1..C26: empty -> id 0; otherwise
    `tf.strings.to_hash_bucket_fast(value, V - 1) + 1` (ids [1, V)), or the
    line number in the feature's vocabulary file, where a value that is not
    in the file is out of vocabulary and maps to id 0, like an empty value.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from recsys.data.raw import RawParser

NUM_DENSE = 13
NUM_CATEGORICAL = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
#: A dense value: empty, or an integer that float32 holds (at most 38 digits;
#: 40 digits became inf). A lone '-' is not a number.
DENSE_PATTERN = r"(-?[0-9]{1,38})?"


class CriteoRawParser(RawParser):
  """Raw Criteo columns (strings `[B]`) -> `features`.

  Args:
    vocab_sizes: the 26 vocabulary sizes V (ids [0, V)).
    tables: feature index j (0 for C1) -> a vocabulary table (value -> id,
      default 0) for the features that have a vocabulary file.

  Example:
    >>> parser = CriteoRawParser([23] * 26)
    >>> raw = {n: tf.constant(["1", ""]) for n in DENSE_NAMES}
    >>> raw.update(
    ...   {n: tf.constant(["68fd1e64", ""]) for n in CATEGORICAL_NAMES})
    >>> features = parser.parse_raw(raw, CATEGORICAL_NAMES)
    >>> features["dense"].shape, features["categorical"]["C1"].numpy()[1]
    (TensorShape([2, 13]), 0)
  """

  def __init__(
    self,
    vocab_sizes: Sequence[int],
    tables: Mapping[int, tf.lookup.StaticHashTable] | None = None,
  ):
    super().__init__(name="criteo_raw_parser")
    if len(vocab_sizes) != NUM_CATEGORICAL:
      raise ValueError(
        f"CriteoRawParser needs {NUM_CATEGORICAL} vocabulary sizes "
        f"(C1..C26), got {len(vocab_sizes)}."
      )
    self._vocab_sizes = [int(v) for v in vocab_sizes]
    # A dict keyed by feature name: tracked, so a SavedModel holds the tables.
    self.tables = {
      CATEGORICAL_NAMES[j]: t for j, t in sorted((tables or {}).items())
    }

  def raw_feature_spec(
    self, feature_names: Sequence[str], dense: bool = False
  ) -> dict[str, tf.TensorSpec]:
    """String `[B]` per raw column: I1..I13 if `dense`, then the named C<i>."""
    spec = {}
    if dense:
      spec.update({n: tf.TensorSpec([None], tf.string, n) for n in DENSE_NAMES})
    for name in feature_names:
      if name not in CATEGORICAL_NAMES:
        raise KeyError(
          f"Criteo has no categorical feature {name!r}; it has C1..C26."
        )
      spec[name] = tf.TensorSpec([None], tf.string, name)
    return spec

  def parse_raw(
    self,
    raw: Mapping[str, tf.Tensor],
    feature_names: Sequence[str] = CATEGORICAL_NAMES,
    validate: bool = True,
  ) -> dict[str, Any]:
    """Raw columns -> `{"dense": [B, 13], "categorical": {C<i>: int64 [B]}}`.

    Args:
      raw: column name -> string `[B]`; "dense" is built when I1 is present
        (then all of I1..I13 must be).
      feature_names: the categorical features to build.
      validate: check that every dense value is an integer or empty (an
        InvalidArgumentError naming the column and row otherwise). The reader
        passes False: its line pattern has checked the columns already.
    """
    features: dict[str, Any] = {}
    if DENSE_NAMES[0] in raw:
      columns = []
      for name in DENSE_NAMES:
        column = tf.convert_to_tensor(raw[name], tf.string)
        if validate:
          column = _checked_dense(name, column)
        columns.append(column)
      text = tf.stack(columns, axis=1)
      text = tf.where(text == "", "0", text)
      features["dense"] = tf.math.log1p(
        tf.maximum(tf.strings.to_number(text, tf.float32), 0.0)
      )
    categorical = {}
    for name in feature_names:
      values = tf.convert_to_tensor(raw[name], tf.string)
      categorical[name] = tf.where(
        values == "", tf.constant(0, tf.int64), self._ids(name, values)
      )
    features["categorical"] = categorical
    return features

  def unknown(self, raw: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Features with a vocabulary file: non-empty values not in it (-> id 0)."""
    out = {}
    for name, table in self.tables.items():
      if name in raw:
        values = tf.convert_to_tensor(raw[name], tf.string)
        out[name] = tf.logical_and(
          values != "", tf.equal(table.lookup(values), 0)
        )
    return out

  def _ids(self, name: str, values: tf.Tensor) -> tf.Tensor:
    if name in self.tables:
      return self.tables[name].lookup(values)
    size = self._vocab_sizes[CATEGORICAL_NAMES.index(name)]
    return tf.strings.to_hash_bucket_fast(values, size - 1) + 1


def _checked_dense(name: str, column: tf.Tensor) -> tf.Tensor:
  """`column`, after asserting that each value is an integer or empty."""
  ok = tf.strings.regex_full_match(column, DENSE_PATTERN)

  def message():
    row = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int32)
    value = tf.strings.unicode_transcode(  # a message must be valid UTF-8
      tf.strings.substr(column[row], 0, 100),
      "UTF-8",
      "UTF-8",
      errors="replace",
      replacement_char=0xFFFD,
    )
    # No quotes: TF escapes them in an assertion's message.
    return tf.strings.join(
      [
        "Criteo raw feature ",
        name,
        " got [",
        value,
        "] at row ",
        tf.strings.as_string(row),
        "; expected an integer as text (an optional "
        "minus sign and 1 to 38 digits) or the empty string for a missing "
        "value.",
      ]
    )

  all_ok = tf.reduce_all(ok)
  text = tf.cond(all_ok, lambda: tf.constant(""), message)
  with tf.control_dependencies([tf.debugging.Assert(all_ok, [text])]):
    return tf.identity(column)


__all__ = [
  "CATEGORICAL_NAMES",
  "CriteoRawParser",
  "DENSE_NAMES",
  "DENSE_PATTERN",
]
