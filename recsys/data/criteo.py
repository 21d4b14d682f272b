"""Criteo click logs in TSV: Kaggle Display Advertising and Terabyte `day_N`.

Each line is `label \\t I1..I13 \\t C1..C26`: a 0/1 label, 13 integer counts and
26 categorical values (8-digit hex), any of them possibly empty. Both public
releases share the columns and differ in file naming: Kaggle ships
`train.txt`, Terabyte ships `day_0` .. `day_23` (plain or `.gz`; by the MLPerf
convention `day_23` is the evaluation day).

Conventions (those of the DLRM and MLPerf references):
  * dense: empty -> 0, negatives (Criteo has -1, -2) clipped to 0, then
    `log(1 + x)`; delivered as `features["dense"]` float32 `[B, 13]`.
  * categorical: id 0 is reserved for an empty value (and for out-of-vocabulary
    values with vocabulary files); other values are hashed with
    `tf.strings.to_hash_bucket_fast` (Fingerprint64, stable across runs,
    processes and machines) into ids [1, V) of the feature's vocabulary size V,
    or mapped through a vocabulary file (`<vocab_dir>/C<i>.txt`, one value per
    line, line n -> id n). Delivered as `features["categorical"]["C<i>"]`
    int64 `[B]`.
  * malformed lines (wrong column count, label not 0/1, a dense value that
    is not an integer or does not fit int64): `malformed="fail"` (default)
    stops with an InvalidArgumentError naming file, line number and the
    reason; `malformed="skip"` drops them,
    counts them (`malformed_lines()`), logs the first few and reports the
    total when a finite dataset ends.
  * damaged files: a `.gz` file that is not gzip, or that ends before its gzip
    end-of-stream marker (truncated; checked where an input pipeline reads the
    file whole), stops reading with an error naming the file; so does a split
    whose files are all empty, or (when repeated) hold no well-formed line,
    instead of waiting forever for a batch.

Pipeline: files are interleaved in parallel, each read in chunks of lines
that carry their line numbers, parsed vectorised (batch before parse), then
re-batched to the per-replica batch size. Input pipelines take whole files
when there are at least as many files as pipelines, else every P-th chunk.
"""

import glob
import gzip
import logging
import os
import struct
import threading
import zlib
from collections.abc import Sequence
from typing import Annotated, Any

import gin
import numpy as np
import tensorflow as tf

from recsys import ranges
from recsys.data import text_files
from recsys.data.criteo_raw import (
  CATEGORICAL_NAMES,
  DENSE_NAMES,
  DENSE_PATTERN,
  NUM_CATEGORICAL,
  NUM_DENSE,
  CriteoRawParser,
)
from recsys.data.errors import DataFormatError, DatasetNotFoundError
from recsys.data.pipeline import AUTOTUNE, BatchRequest, DataSource
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec

log = logging.getLogger("recsys.data.criteo")


#: Vocabulary sizes of the MLPerf DLRM benchmark (Terabyte, ids capped at 40M),
#: as in the Cloud TPU DLRM tutorial and the TF Model Garden.
MLPERF_VOCAB_SIZES = (
  39884406,
  39043,
  17289,
  7420,
  20263,
  3,
  7120,
  1543,
  63,
  38532951,
  2953546,
  403346,
  10,
  2208,
  11938,
  155,
  4,
  976,
  14,
  39979771,
  25641295,
  39664984,
  585935,
  12972,
  108,
  36,
)
#: Distinct values per feature in Kaggle's train.txt (DLRM reference's sizes).
KAGGLE_VOCAB_SIZES = (
  1460,
  583,
  10131227,
  2202608,
  305,
  24,
  12517,
  633,
  3,
  93145,
  5683,
  8351593,
  3194,
  27,
  14992,
  5461306,
  10,
  5652,
  2173,
  4,
  7046547,
  18,
  15,
  286181,
  105,
  142572,
)
VOCAB_PRESETS = {"mlperf": MLPERF_VOCAB_SIZES, "kaggle": KAGGLE_VOCAB_SIZES}

LAYOUTS = ("kaggle", "terabyte")
MALFORMED_POLICIES = ("fail", "skip")
#: Files: a glob pattern or path, or a list of them.
_Files = Annotated[
  None | str | Sequence[str],
  ranges.AnyOf((ranges.Text(), ranges.Each(ranges.Text(), min_len=1))),
]
#: Terabyte days: 0 to 23, at least one.
_Days = Annotated[Sequence[int], ranges.Each(ranges.Int(0, 23), min_len=1)]
_REASONS = (
  "",
  "wrong number of tab-separated columns",
  "label is not 0 or 1",
  "a dense (integer) column is not an integer that fits 64 bits (an "
  "optional '-' and digits, -2**63 to 2**63 - 1, or empty)",
  "the line is not valid UTF-8 text",
)
_DENSE = DENSE_PATTERN
_LOGGED_SKIPS = 10


def _printable(text: tf.Tensor) -> tf.Tensor:
  """`text` with bytes that are not UTF-8 replaced (U+FFFD).

  An error message must decode: TF hands it to Python as UTF-8, and a stray
  byte (or a cut multi-byte character) turned the report of a bad line into
  a UnicodeDecodeError without file or line.
  """
  return tf.strings.unicode_transcode(
    text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
  )


class CriteoConfigError(SettingsError):
  """Inconsistent CriteoTSV settings."""


class MalformedLines:
  """Counts (and keeps the first few of) the malformed lines a source skipped.

  Thread-safe: parallel parse calls record into it through `tf.py_function`.
  """

  def __init__(self, keep: int = _LOGGED_SKIPS):
    self._lock = threading.Lock()
    self._keep = keep
    self.count = 0
    self.first: list[tuple[str, int, str]] = []  # (file, line, reason)

  def record(self, path: str, lines: np.ndarray, reasons: np.ndarray) -> None:
    """Counts a chunk's malformed lines; keeps the earliest few by (file, line).

    Chunks are parsed in parallel, so they arrive in any order: keeping the
    smallest (file, line) makes the report the same on every run.
    """
    with self._lock:
      for line, reason in zip(lines, reasons):
        if self.count < self._keep:  # log a few, count them all
          log.warning(
            "skipping malformed Criteo line %s:%d (%s)",
            path,
            int(line),
            _REASONS[int(reason)],
          )
        self.count += 1
        self.first.append((path, int(line), _REASONS[int(reason)]))
      self.first.sort(key=lambda entry: entry[:2])
      del self.first[self._keep :]

  def __repr__(self) -> str:
    where = ", ".join(f"{f}:{n} ({r})" for f, n, r in self.first)
    return f"MalformedLines(count={self.count}, first=[{where}])"


def _expand(patterns: str | Sequence[str]) -> list[str]:
  """The files the patterns name (globs skip folders; a named folder raises)."""
  if isinstance(patterns, str):
    patterns = [patterns]
  files: list[str] = []
  for pattern in patterns:
    if glob.has_magic(pattern):
      files.extend(
        p for p in sorted(glob.glob(pattern)) if not os.path.isdir(p)
      )
      continue
    matches = [pattern] if os.path.exists(pattern) else []
    for path in matches:
      if os.path.isdir(path):
        raise DatasetNotFoundError(
          f"Criteo file pattern {pattern!r} names the folder {path!r}; "
          f"train_files/eval_files take files or glob patterns (e.g. "
          f"{os.path.join(path, 'day_*')!r}), or pass data_dir={path!r}."
        )
    files.extend(matches)
  return files


_GZIP_MAGIC = b"\x1f\x8b"


def _gzip_size(path: str) -> int:
  """The uncompressed size mod 2**32 that a gzip file's trailer records.

  Raises:
    DataFormatError: the file is not gzip (its name ends in .gz).
  """
  with open(path, "rb") as f:
    head = f.read(2)
    if head != _GZIP_MAGIC:
      raise DataFormatError(
        f"Criteo file {path!r} ends in .gz but is not gzip-compressed (it "
        f"starts with bytes {head.hex() or 'nothing: the file is empty'}, not "
        "1f8b). Check it with `gzip -t`; if it is plain text, remove the .gz "
        "suffix."
      )
    f.seek(0, os.SEEK_END)
    if f.tell() < 18:  # header (10) + trailer (8): a cut-off file
      return -1
    f.seek(-4, os.SEEK_END)
    return struct.unpack("<I", f.read(4))[0]


def _gzip_intact(path: tf.Tensor) -> bool:
  """Whether Python's gzip reads the whole file (multi-member files too)."""
  try:
    with gzip.open(path.numpy().decode("utf-8"), "rb") as f:
      while f.read(1 << 24):
        pass
  except (EOFError, OSError, zlib.error):
    return False
  return True


def _first_bytes(path: str, n: int) -> bytes:
  """The first `n` bytes of a file's text (decompressed for .gz; b"" if
  they cannot be read: the gzip end check reports a damaged file)."""
  try:
    if path.endswith(".gz"):
      with gzip.open(path, "rb") as f:
        return f.read(n)
    with open(path, "rb") as f:
      return f.read(n)
  except (EOFError, OSError, zlib.error):
    return b""


def _check_files(paths: list[str], split: str) -> list[int]:
  """Checks a split's files; returns each file's gzip trailer size (-1: none).

  Raises:
    DataFormatError: a .gz file is not gzip, a file is UTF-16 or UTF-32
      text (its byte-order mark; a UTF-8 one is cut as lines are read), or
      every file of the split is empty (a repeated split would wait
      forever for its first batch).
  """
  sizes, empty = [], []
  for path in paths:
    if path.endswith(".gz"):
      size = _gzip_size(path) if os.path.getsize(path) else 0
      sizes.append(size)
    else:
      size = os.path.getsize(path)
      sizes.append(-1)
    if size == 0:
      empty.append(path)
    else:
      text_files.check_encoding_mark(_first_bytes(path, 4), path)
  if empty and len(empty) == len(paths):
    raise DataFormatError(
      f"every Criteo {split} file is empty: {empty[:5]}"
      f"{' ...' if len(empty) > 5 else ''}. Expected lines of 'label \\t 13 "
      "integers \\t 26 categorical values'; re-download or re-extract them."
    )
  for path in empty:
    log.warning(
      "Criteo %s file %s is empty; it contributes no examples.", split, path
    )
  return sizes


def _day_files(data_dir: str, days: Sequence[int]) -> list[str]:
  files = []
  for day in days:
    for suffix in ("", ".gz"):
      path = os.path.join(data_dir, f"day_{day}{suffix}")
      if os.path.exists(path):
        files.append(path)
        break
  return files


def _read_vocabulary(path: str, name: str) -> list[str]:
  """The values of a vocabulary file, line n -> id n (checked).

  Raises:
    DataFormatError: the file is empty or a value repeats (names the lines).
  """
  with open(path, "rb") as f:
    text_files.check_encoding_mark(f.read(4), path)
  with open(path, encoding="utf-8-sig") as f:  # a UTF-8 mark is cut
    values = [line.rstrip("\r\n") for line in f]
  if not values:
    raise DataFormatError(
      f"vocabulary file {path!r} is empty; expected one {name} value per "
      f"line (line n -> id n), or remove it to hash {name} instead."
    )
  first: dict[str, int] = {}
  for line, value in enumerate(values, start=1):
    if value in first:
      raise DataFormatError(
        f"{path}:{line}: vocabulary value {value!r} repeats line "
        f"{first[value]}; each {name} value must appear once (line n -> id n)."
      )
    first[value] = line
  return values


def _fail_at_end(ds: tf.data.Dataset, message: str) -> tf.data.Dataset:
  """An empty dataset like `ds` that raises InvalidArgumentError when read."""

  def fail(x):
    with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
      return tf.identity(x)

  return tf.data.Dataset.range(1).map(fail).flat_map(lambda _: ds.take(0))


def _check_gzip_end(
  chunks: tf.data.Dataset,
  file_index: tf.Tensor,
  path: tf.Tensor,
  expected: tf.Tensor,
) -> tf.data.Dataset:
  """A file's `(file_index, first_line, lines)` chunks, checked to end whole.

  TF's gzip reader ends quietly where a truncated file ends. The gzip trailer
  records the uncompressed size (mod 2**32), which the bytes of the lines
  read plus their line ends must match (newlines "\\n" or "\\r\\n", the last
  one optional). Only on a mismatch is the file decompressed again in Python,
  which tells a truncated file from a (complete) multi-member one. The check
  runs once, after the file's last chunk, in the same pass.

  Args:
    chunks: one file's chunks.
    file_index: the file's index (scalar int64).
    path: the file's path (scalar string), for the message.
    expected: the trailer's size; < 0 for a file that is not gzip (no check).
  """
  sentinel = tf.data.Dataset.from_tensors(
    (file_index, tf.constant(-1, tf.int64), tf.constant([], tf.string))
  )
  zero = tf.constant(0, tf.int64)

  def count(state, x):
    num_bytes = state[0] + tf.reduce_sum(
      tf.cast(tf.strings.length(x[2]), tf.int64)
    )
    num_lines = state[1] + tf.size(x[2], out_type=tf.int64)
    return (num_bytes, num_lines), (x, num_bytes, num_lines)

  def whole(num_bytes, num_lines):
    sizes = tf.stack(
      [
        num_bytes + num_lines,
        num_bytes + num_lines - 1,
        num_bytes + 2 * num_lines,
        num_bytes + 2 * num_lines - 1,
      ]
    )
    fits = tf.reduce_any(tf.equal(tf.math.floormod(sizes, 1 << 32), expected))
    return tf.cond(
      fits,
      lambda: tf.constant(True),
      lambda: tf.py_function(_gzip_intact, [path], tf.bool),
    )

  def check(x, num_bytes, num_lines):
    last = tf.logical_and(tf.equal(x[1], -1), expected >= 0)
    ok = tf.cond(
      last, lambda: whole(num_bytes, num_lines), lambda: tf.constant(True)
    )
    message = tf.strings.join(
      [
        "Criteo file ",
        path,
        " is a truncated or corrupt gzip file: it ends "
        "before its gzip end-of-stream marker (",
        tf.strings.as_string(num_lines),
        " lines read). Re-download or re-compress it; `gzip -t` checks a file.",
      ]
    )
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
      return tf.identity(x[0]), tf.identity(x[1]), tf.identity(x[2])

  checked = chunks.concatenate(sentinel).scan((zero, zero), count).map(check)
  return checked.filter(lambda i, first, lines: tf.not_equal(first, -1))


def hashed_vocab_sizes(
  vocab_sizes: str | int | Sequence[int], max_vocab_size: int | None = None
) -> list[int]:
  """The 26 vocabulary sizes of hashed features (see `CriteoTSV`), checked.

  Raises:
    CriteoConfigError: an unknown preset, not 26 sizes, or a size below 2.
  """
  if isinstance(vocab_sizes, str):
    if vocab_sizes not in VOCAB_PRESETS:
      raise CriteoConfigError(
        f"unknown vocabulary preset {vocab_sizes!r}; valid: "
        f"{', '.join(VOCAB_PRESETS)}, or give 26 sizes."
      )
    sizes = list(VOCAB_PRESETS[vocab_sizes])
  elif isinstance(vocab_sizes, int):
    sizes = [vocab_sizes] * NUM_CATEGORICAL
  else:
    sizes = [int(v) for v in vocab_sizes]
  if len(sizes) != NUM_CATEGORICAL:
    raise CriteoConfigError(
      f"vocab_sizes has {len(sizes)} entries; Criteo has "
      f"{NUM_CATEGORICAL} categorical features (C1..C26)."
    )
  if max_vocab_size is not None:
    sizes = [min(v, int(max_vocab_size)) for v in sizes]
  for name, v in zip(CATEGORICAL_NAMES, sizes):
    if v < 2:
      raise CriteoConfigError(
        f"feature {name!r}: vocabulary size must be >= 2 (id 0 "
        f"is reserved for empty values), got {v}."
      )
  return sizes


@gin.register
class CriteoTSV(DataSource):
  """Criteo TSV files (Kaggle or Terabyte layout), hashed or vocabulary ids.

  Example:
    >>> source = CriteoTSV(data_dir="/data/criteo_tb", layout="terabyte",
    ...                    vocab_sizes="mlperf", max_vocab_size=1_000_000)
    >>> features, labels = next(iter(source.dataset(2048)))
    >>> features["dense"].shape, features["categorical"]["C1"].shape
    (TensorShape([2048, 13]), TensorShape([2048]))

  Attributes:
    feature_specs: C1..C26, one-hot, one table each.
    num_dense: 13.
    train_files, eval_files: the resolved file lists.
    skipped: the `MalformedLines` record of `malformed="skip"`.
  """

  @ranges.checked
  def __init__(
    self,
    train_files: _Files = None,
    eval_files: _Files = None,
    *,
    data_dir: ranges.Name | None = None,
    layout: Annotated[str, ranges.Choice(LAYOUTS)] = "kaggle",
    vocab_sizes: Annotated[
      str | int | Sequence[int],
      ranges.AnyOf(
        (
          ranges.Choice(tuple(VOCAB_PRESETS)),
          ranges.Int(2),
          # 26 of them: hashed_vocab_sizes says so, naming the features.
          ranges.Each(ranges.Int(2), min_len=1),
        )
      ),
    ] = "kaggle",
    max_vocab_size: Annotated[int | None, ranges.Int(2)] = None,
    vocab_dir: ranges.Name | None = None,
    malformed: Annotated[str, ranges.Choice(MALFORMED_POLICIES)] = "fail",
    has_label: ranges.Flag = True,
    train_days: _Days = tuple(range(23)),
    eval_days: _Days = (23,),
    shuffle_files: ranges.Flag = True,
    cycle_length: ranges.PositiveInt = 4,
    chunk_size: ranges.PositiveInt = 4096,
    seed: ranges.Seed = 0,
  ):
    """Resolves files and vocabularies.

    Args:
      train_files: glob pattern(s) or paths of training files.
      eval_files: glob pattern(s) or paths of evaluation files.
      data_dir: instead of file lists, a folder in the given layout: Kaggle
        `train.txt[.gz]` (+ `eval.txt[.gz]` or `val.txt[.gz]`), Terabyte
        `day_<n>[.gz]` for `train_days` / `eval_days`.
      layout: "kaggle" or "terabyte" (the file naming under `data_dir`).
      vocab_sizes: per-feature vocabulary sizes V (ids [0, V), 0 reserved), a
        preset name ("kaggle", "mlperf"), or one int for all features; each
        size is at least 2.
      max_vocab_size: cap every vocabulary size (e.g. to fit a CPU).
      vocab_dir: folder of vocabulary files `C<i>.txt`; features with a file
        use it (size = lines + 1), the others are hashed.
      malformed: "fail" or "skip" (see module docstring).
      has_label: False for files without the label column (Kaggle test.txt);
        labels are then zeros.
      train_days, eval_days: Terabyte days under `data_dir`.
      shuffle_files: shuffle the training file order each epoch (seeded).
      cycle_length: files read in parallel.
      chunk_size: lines parsed per vectorised call.
      seed: file-order seed.

    Raises:
      SettingRangeError: a setting outside its declared range.
      CriteoConfigError: vocabulary settings that do not fit together.
      DatasetNotFoundError: no file matched.
    """
    self.layout, self.malformed, self.has_label = (
      layout,
      malformed,
      bool(has_label),
    )
    self.shuffle_files, self.seed = bool(shuffle_files), int(seed)
    self.cycle_length, self.chunk_size = int(cycle_length), int(chunk_size)
    self.num_dense = NUM_DENSE
    self.skipped = MalformedLines()
    self.train_files, self.eval_files = self._resolve(
      train_files, eval_files, data_dir, train_days, eval_days
    )
    self._gzip_sizes = dict(
      zip(self.train_files, _check_files(self.train_files, "training"))
    )
    if self.eval_files:
      self._gzip_sizes.update(
        zip(self.eval_files, _check_files(self.eval_files, "evaluation"))
      )

    sizes = hashed_vocab_sizes(vocab_sizes, max_vocab_size)
    self._tables: dict[int, tf.lookup.StaticHashTable] = {}
    if vocab_dir is not None:
      if not os.path.isdir(vocab_dir):
        raise DatasetNotFoundError(
          f"vocab_dir {vocab_dir!r} is not a folder; it should hold C1.txt .. "
          "C26.txt, "
          "one categorical value per line."
        )
      with tf.init_scope():
        for j, name in enumerate(CATEGORICAL_NAMES):
          path = os.path.join(vocab_dir, f"{name}.txt")
          if not os.path.exists(path):
            continue
          values = _read_vocabulary(path, name)
          self._tables[j] = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
              tf.constant(values, tf.string),
              tf.range(1, len(values) + 1, dtype=tf.int64),
            ),
            default_value=0,
          )
          sizes[j] = len(values) + 1
      if not self._tables:
        raise DatasetNotFoundError(
          f"vocab_dir {vocab_dir!r} holds none of C1.txt .. C26.txt."
        )
    self.vocab_sizes = sizes
    self.feature_specs = [
      FeatureSpec(name, v) for name, v in zip(CATEGORICAL_NAMES, sizes)
    ]
    self._raw = CriteoRawParser(sizes, self._tables)

  @classmethod
  def feature_specs_without_files(
    cls,
    vocab_sizes: str | int | Sequence[int] = "kaggle",
    max_vocab_size: int | None = None,
    vocab_dir: str | None = None,
    **reading: Any,
  ) -> list[FeatureSpec] | None:
    """The tables these settings would build, without reading any file.

    What `recsys info` plans memory from before the data is downloaded.
    None with `vocab_dir` (those sizes are the files' lengths); settings
    about the files themselves (`reading`: data_dir, layout, ...) are
    ignored.
    """
    del reading
    if vocab_dir is not None:
      return None
    sizes = hashed_vocab_sizes(vocab_sizes, max_vocab_size)
    return [FeatureSpec(name, v) for name, v in zip(CATEGORICAL_NAMES, sizes)]

  def _resolve(self, train_files, eval_files, data_dir, train_days, eval_days):
    if data_dir is not None:
      if not os.path.isdir(data_dir):
        cwd = "" if os.path.isabs(data_dir) else f" (cwd: {os.getcwd()})"
        raise DatasetNotFoundError(
          self._where(data_dir, f"folder {data_dir!r} does not exist{cwd}")
        )
      if self.layout == "terabyte":
        found_train = _day_files(data_dir, train_days)
        found_eval = _day_files(data_dir, eval_days)
      else:
        found_train = _expand(
          [
            os.path.join(data_dir, "train.txt"),
            os.path.join(data_dir, "train.txt.gz"),
          ]
        )[:1]
        found_eval = (
          _expand(
            [
              os.path.join(data_dir, n)
              for n in ("eval.txt", "eval.txt.gz", "val.txt", "val.txt.gz")
            ]
          )
        )[:1]
      train = _expand(train_files) if train_files is not None else found_train
      evaluation = _expand(eval_files) if eval_files is not None else found_eval
      if not train:
        raise DatasetNotFoundError(
          self._where(data_dir, f"no training file found in {data_dir!r}")
        )
      return train, evaluation
    if train_files is None:
      raise CriteoConfigError("give train_files (glob patterns) or data_dir.")
    train = _expand(train_files)
    if not train:
      raise DatasetNotFoundError(
        f"no Criteo file matches train_files={train_files!r}; check the path "
        "or "
        "pattern (plain or .gz TSV files)."
      )
    evaluation = _expand(eval_files) if eval_files is not None else []
    if eval_files is not None and not evaluation:
      raise DatasetNotFoundError(
        f"no Criteo file matches eval_files={eval_files!r}."
      )
    return train, evaluation

  def _where(self, data_dir: str, problem: str) -> str:
    """`problem`, then which files to put into `data_dir`."""
    if self.layout == "terabyte":
      expected = (
        "day_0 .. day_22 for training and day_23 for evaluation (plain or "
        ".gz), from the Criteo 1TB Click Logs "
        "(https://ailab.criteo.com/ressources/)"
      )
    else:
      expected = (
        "train.txt (and eval.txt or val.txt) from Kaggle's Display Advertising "
        "Challenge dac.tar.gz (plain or .gz)"
      )
    return (
      f"Criteo {self.layout} data: {problem}; put {expected} in "
      f"{data_dir!r}, or pass train_files/eval_files."
    )

  # ------------------------------------------------------------------ parsing

  @property
  def num_columns(self) -> int:
    """Tab-separated columns per line: 39, plus 1 with the label."""
    return NUM_DENSE + NUM_CATEGORICAL + (1 if self.has_label else 0)

  @property
  def _line_pattern(self) -> str:
    """RE2 pattern of a well-formed line (columns, label, integer columns)."""
    dense = _DENSE + r"(\t" + _DENSE + ")" + f"{{{NUM_DENSE - 1}}}"
    label = r"[01]\t" if self.has_label else ""
    return label + dense + r"(\t[^\t]*)" + f"{{{NUM_CATEGORICAL}}}"

  def _reasons(self, lines: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Malformed lines: reason codes [n] (see _REASONS), column counts [n]."""
    ncol = self.num_columns
    offset = 1 if self.has_label else 0
    cols = tf.strings.split(lines, "\t")
    counts = cols.row_lengths()
    table = cols.to_tensor(default_value="", shape=[None, ncol])
    dense_ok = tf.reduce_all(
      tf.strings.regex_full_match(
        table[:, offset : offset + NUM_DENSE], _DENSE
      ),
      axis=1,
    )
    reason = tf.where(counts != ncol, 1, 0)
    if self.has_label:
      label_ok = tf.logical_or(
        tf.equal(table[:, 0], "0"), tf.equal(table[:, 0], "1")
      )
      reason = tf.where((reason == 0) & ~label_ok, 2, reason)
    reason = tf.where((reason == 0) & ~dense_ok, 3, reason)
    utf8_ok = tf.equal(_printable(lines), lines)
    return tf.where((reason == 0) & ~utf8_ok, 4, reason), counts

  def _parse(self, files: tf.Tensor, file_index, first_line, lines):
    """Parses a chunk of lines into `(features, labels)`, handling bad lines.

    Fast path: one RE2 match per line validates it, then a split whose values
    reshape to `[n, columns]`; malformed lines are diagnosed only when present.
    """
    ncol = self.num_columns
    offset = 1 if self.has_label else 0
    # A UTF-8 byte-order mark before a file's first line is not data (its
    # label was refused, or skipped and counted).
    lines = text_files.first_line_without_bom(lines, tf.equal(first_line, 0))
    ok = tf.strings.regex_full_match(lines, self._line_pattern)
    any_bad = tf.logical_not(tf.reduce_all(ok))
    line_numbers = first_line + tf.range(tf.size(lines, out_type=tf.int64)) + 1

    if self.malformed == "fail":

      def message():
        row = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int32)
        reason, counts = self._reasons(lines[row : row + 1])
        return tf.strings.join(
          [
            "malformed Criteo line ",
            files[file_index],
            ":",
            tf.strings.as_string(line_numbers[row]),
            ": ",
            tf.gather(tf.constant(_REASONS), reason[0]),
            " (expected ",
            str(ncol),
            " tab-separated columns: ",
            "label 0/1, " if self.has_label else "",
            "13 integers or empty, 26 categorical; got ",
            tf.strings.as_string(counts[0]),
            " columns): ",
            _printable(tf.strings.substr(lines[row], 0, 200)),
            ". Fix or remove the line, or set malformed to skip to drop and "
            "count such lines.",
            tf.where(
              tf.strings.regex_full_match(files[file_index], r".*\.gz"),
              " If it is the file's last line, the .gz file may be truncated: "
              "check it with `gzip -t`.",
              "",
            ),
          ]
        )

      text = tf.cond(any_bad, message, lambda: tf.constant(""))
      deps = [tf.debugging.Assert(tf.logical_not(any_bad), [text])]
    else:

      def record():
        reason, _ = self._reasons(tf.boolean_mask(lines, ~ok))
        tf.py_function(
          lambda f, n, r: self.skipped.record(
            f.numpy().decode("utf-8", "replace"), n.numpy(), r.numpy()
          ),
          [files[file_index], tf.boolean_mask(line_numbers, ~ok), reason],
          [],
        )
        return tf.constant(0)

      deps = [tf.cond(any_bad, record, lambda: tf.constant(0))]
      lines = tf.boolean_mask(lines, ok)

    with tf.control_dependencies(deps):
      table = tf.reshape(tf.strings.split(lines, "\t").flat_values, [-1, ncol])
    # The line pattern has checked the dense columns: no second check here.
    raw = {
      name: table[:, offset + k]
      for k, name in enumerate(DENSE_NAMES + CATEGORICAL_NAMES)
    }
    features = self._raw.parse_raw(raw, CATEGORICAL_NAMES, validate=False)
    if self.has_label:
      labels = tf.strings.to_number(table[:, 0], tf.float32)
    else:
      labels = tf.zeros(tf.shape(features["dense"])[:1], tf.float32)
    return features, labels

  # ------------------------------------------------------------------ batches

  def _batches(self, request: BatchRequest) -> tf.data.Dataset:
    """Batches of `(features, labels)` of a split, for `DataSource.dataset`.

    One epoch reads the (shuffled) files in parallel chunks; a repeated split
    repeats whole epochs before re-batching, so batches still run on across
    epoch boundaries, and an epoch without a single well-formed line is an
    error instead of a silent endless loop.

    Raises:
      DatasetNotFoundError: the evaluation split has no files.
    """
    training, repeat = request.training, request.repeat
    paths = self.train_files if training else self.eval_files
    if not paths:
      raise DatasetNotFoundError(
        "CriteoTSV has no evaluation files: pass eval_files=..., or under "
        "data_dir "
        "put eval.txt (Kaggle layout) or day_23 (Terabyte layout)."
      )
    pipeline, pipelines = request.pipeline, request.pipelines
    indices = np.arange(len(paths))
    by_file = len(paths) >= pipelines
    if by_file:
      indices = indices[pipeline::pipelines]
    files = tf.constant(paths)
    gzip_sizes = tf.constant(
      [self._gzip_sizes.get(p, -1) for p in paths], tf.int64
    )
    chunk = self.chunk_size

    def read(file_index):
      path = files[file_index]
      compression = tf.where(
        tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", ""
      )
      chunks = (
        tf.data.TextLineDataset(
          path, compression_type=compression, buffer_size=1 << 20
        )
        .batch(chunk)
        .enumerate()
      )
      if not by_file:
        chunks = chunks.shard(pipelines, pipeline)
      chunks = chunks.map(
        tf.autograph.experimental.do_not_convert(
          lambda n, lines: (file_index, n * chunk, lines)
        )
      )
      if by_file:  # whole files: check that a .gz file was read to its end
        chunks = _check_gzip_end(
          chunks, file_index, path, gzip_sizes[file_index]
        )
      return chunks

    ds = tf.data.Dataset.from_tensor_slices(indices)
    if training and self.shuffle_files and len(indices) > 1:
      ds = ds.shuffle(
        len(indices), seed=self.seed, reshuffle_each_iteration=True
      )
    ds = ds.interleave(
      tf.autograph.experimental.do_not_convert(read),
      cycle_length=max(1, min(self.cycle_length, len(indices))),
      num_parallel_calls=AUTOTUNE,
      deterministic=True,
    )
    parse = tf.autograph.experimental.do_not_convert(
      lambda i, first, lines: self._parse(files, i, first, lines)
    )
    ds = ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True)
    if repeat:
      # `repeat` ends (instead of looping forever) when an epoch is empty;
      # chunks emptied by the skip policy must not count as data.
      ds = ds.filter(lambda features, labels: tf.size(labels) > 0)
      mine = [paths[i] for i in indices]
      ds = ds.repeat().concatenate(
        _fail_at_end(
          ds,
          (
            f"CriteoTSV: the {'training' if training else 'evaluation'} files "
            f"{mine[:3]}{' ...' if len(mine) > 3 else ''} of input pipeline "
            f"{pipeline} hold no well-formed line (all empty, blank, or "
            "dropped "
            "as malformed by malformed='skip': see the warnings), so the "
            "repeated split can give no batch. Check the files."
          ),
        )
      )
    ds = ds.rebatch(request.batch_size, drop_remainder=request.drop_remainder)
    if self.malformed == "skip" and not repeat:
      ds = ds.concatenate(self._end_report(ds, paths))
    return ds

  def _end_report(
    self, ds: tf.data.Dataset, paths: list[str]
  ) -> tf.data.Dataset:
    """An empty dataset that logs the skipped-line count when it is reached."""

    def report(x):
      def log_total():
        if self.skipped.count:
          log.warning(
            "skipped %d malformed Criteo line(s) in %d file(s) %s; first: %s",
            self.skipped.count,
            len(paths),
            paths[:3],
            self.skipped.first[:3],
          )

      tf.py_function(log_total, [], [])
      return x

    return tf.data.Dataset.range(1).map(report).flat_map(lambda _: ds.take(0))

  def raw_parser(self) -> CriteoRawParser:
    """The raw columns -> features transformation of `_parse` (for serving)."""
    return self._raw

  def malformed_lines(self) -> int:
    """How many malformed lines the "skip" policy has dropped so far."""
    return self.skipped.count
