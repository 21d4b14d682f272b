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


def _digits_at_most(bound: str) -> str:
  """RE2 alternatives matching the decimals of `len(bound)` digits <= bound."""
  alternatives = []
  for i, digit in enumerate(bound):
    if digit != "0":
      rest = len(bound) - i - 1
      tail = f"[0-9]{{{rest}}}" if rest else ""
      alternatives.append(f"{bound[:i]}[0-{int(digit) - 1}]{tail}")
  alternatives.append(bound)
  return "|".join(alternatives)


INT64_MAX = 2**63 - 1
#: A dense value: empty, or a count that fits a 64-bit integer (leading
#: zeros allowed): at most 18 significant digits, or 19 up to 2**63 - 1
#: (down to -2**63). A lone '-' is not a number, nor 1e3 nor 1.5.
DENSE_PATTERN = (
  f"(-0*([0-9]{{1,18}}|{_digits_at_most(str(INT64_MAX + 1))})"
  f"|0*([0-9]{{1,18}}|{_digits_at_most(str(INT64_MAX))}))?"
)
#: A categorical value: anything but a column separator or a line end (no
#: TSV line can carry one in a column).
CATEGORICAL_PATTERN = r"[^\t\n]*"


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
      validate: check that every dense value is an integer that fits int64
        or empty, and that no categorical value holds a tab or newline (an
        InvalidArgumentError naming the column and row otherwise). The
        reader passes False: its line pattern has checked the columns
        already.
    """
    features: dict[str, Any] = {}
    if DENSE_NAMES[0] in raw:
      text = tf.stack(
        [tf.convert_to_tensor(raw[n], tf.string) for n in DENSE_NAMES], axis=1
      )
      if validate:
        text = _checked(DENSE_NAMES, text, DENSE_PATTERN, _DENSE_EXPECTED)
      text = tf.where(text == "", "0", text)
      features["dense"] = tf.math.log1p(
        tf.maximum(tf.strings.to_number(text, tf.float32), 0.0)
      )
    columns = {
      n: tf.convert_to_tensor(raw[n], tf.string) for n in feature_names
    }
    if validate and columns:  # one check of every column, as one table
      table = _checked(
        list(columns),
        tf.stack(list(columns.values()), axis=1),
        CATEGORICAL_PATTERN,
        _CATEGORICAL_EXPECTED,
      )
      columns = dict(zip(columns, tf.unstack(table, len(columns), axis=1)))
    categorical = {}
    for name, values in columns.items():
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


_DENSE_EXPECTED = (
  "; expected an integer as text that fits 64 bits (an optional minus sign "
  f"and digits, from -{INT64_MAX + 1} to {INT64_MAX}) or the empty string "
  "for a missing value."
)
_CATEGORICAL_EXPECTED = (
  "; expected one TSV column's value, which holds no tab or newline (the "
  "empty string for a missing value)."
)


def _checked(
  names: Sequence[str], table: tf.Tensor, pattern: str, expected: str
) -> tf.Tensor:
  """`table` `[B, C]` (column c is raw feature `names[c]`), after asserting
  that every value matches `pattern`; the message names the first bad
  value's column and row and shows it (a tab or newline as \\t, \\n)."""
  ok = tf.strings.regex_full_match(table, pattern)

  def message():
    first = tf.argmin(
      tf.reshape(tf.cast(ok, tf.int32), [-1]), output_type=tf.int32
    )
    row, col = first // len(names), first % len(names)
    value = tf.strings.unicode_transcode(  # a message must be valid UTF-8
      tf.strings.substr(table[row, col], 0, 100),
      "UTF-8",
      "UTF-8",
      errors="replace",
      replacement_char=0xFFFD,
    )
    value = tf.strings.regex_replace(value, "\t", "\\\\t")
    value = tf.strings.regex_replace(value, "\n", "\\\\n")
    # No quotes: TF escapes them in an assertion's message.
    return tf.strings.join(
      [
        "Criteo raw feature ",
        tf.gather(tf.constant(list(names)), col),
        " got [",
        value,
        "] at row ",
        tf.strings.as_string(row),
        expected,
      ]
    )

  all_ok = tf.reduce_all(ok)
  text = tf.cond(all_ok, lambda: tf.constant(""), message)
  with tf.control_dependencies([tf.debugging.Assert(all_ok, [text])]):
    return tf.identity(table)


__all__ = [
  "CATEGORICAL_NAMES",
  "CriteoRawParser",
  "DENSE_NAMES",
  "DENSE_PATTERN",
]
