"""The batches implicit ALS trains on: distinct rows with their full histories.

One epoch of iALS (`recsys.models.retrieval.ials.ImplicitALS`) is two
halves: every user row solved from the items, then every item row from the
users. A half opens with its **Gramian batches**: the other side's rows,
each exactly once over the half's Gramian batches, carried in the history
feature (`ials_side` `ITEM_GRAMIAN` or `USER_GRAMIAN`, plus `RESTART` on
the half's first step), from which the model sums the other table's
Gramian once, all-reduced over the replicas (ALX's scheme: no replica reads
more than its share of the table). Then the **solve batches**: DISTINCT rows
of one side (`ials_side` 0: users, 1: items; -1: padding; `ials_counts`
their histories' lengths) with their whole history on the other side.
Every feature is a ragged sequence except the one-hot user and item ids
(named after the source's: "user" and "item" by default); the side not
being solved carries id 0 and gets a zero gradient.

Example:
  >>> specs = feature_specs(pairs, num_user_rows=944, num_item_rows=1683,
  ...                       batch_size=256)
  >>> for features, labels in epoch_batches(pairs, 944, 1683, 256): ...
"""

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from recsys._keras import tf
from recsys.data.errors import DataFormatError
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec

USER, ITEM = "user", "item"
USER_HISTORY, ITEM_HISTORY = "ials_user_history", "ials_item_history"
SIDE = "ials_side"
#: The number of observed pairs of each row (its history's length), `[B]`.
COUNTS = "ials_counts"
#: Each entry's row: the batch position of the row's first entry, `[B]`.
SEGMENT = "ials_segment"
USER_SIDE, ITEM_SIDE, PADDING = 0, 1, -1
#: A Gramian batch's `ials_side`: its history feature holds rows of the item
#: table (`USER_HISTORY`, before the user half) or the user table
#: (`ITEM_HISTORY`, before the item half), to be added to that Gramian...
ITEM_GRAMIAN, USER_GRAMIAN = 2, 3
#: ... plus RESTART on the half's first Gramian step: the sum starts afresh.
RESTART = 2


class IALSBatchError(DataFormatError):
  """Pairs or a batch that iALS cannot train on (ids out of range,
  duplicate rows in a batch): the data, not a setting (exit status 1)."""


class HistoryChunkError(SettingsError, IALSBatchError):
  """`history_chunk` is no number of ids, or cuts a history into more
  chunks than a batch holds: a setting (exit status 2)."""


def _histories(keys: np.ndarray, values: np.ndarray, size: int) -> list:
  order = np.argsort(keys, kind="stable")
  bounds = np.searchsorted(keys[order], np.arange(size + 1))
  return [values[order[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]


def unique_pairs(
  pairs: np.ndarray, num_user_rows: int, num_item_rows: int
) -> np.ndarray:
  """The distinct (user, item) pairs `[n, 2]` int64, checked in range."""
  pairs = np.unique(np.asarray(pairs, np.int64).reshape(-1, 2), axis=0)
  for column, size, name in (
    (0, num_user_rows, USER),
    (1, num_item_rows, ITEM),
  ):
    if len(pairs) and (
      pairs[:, column].min() < 0 or pairs[:, column].max() >= size
    ):
      raise IALSBatchError(
        f"iALS pairs: {name} ids must be in [0, {size}), got "
        f"[{pairs[:, column].min()}, {pairs[:, column].max()}]."
      )
  return pairs


def feature_specs(
  pairs: np.ndarray,
  num_user_rows: int,
  num_item_rows: int,
  batch_size: int,
  user: str = USER,
  item: str = ITEM,
  history_chunk: int | None = None,
) -> list:
  """The four features of `epoch_batches` (tables named after `user` and
  `item`, the one-hot id features); `batch_size` per replica; histories
  padded to the longest, or to `history_chunk` when that is shorter."""
  pairs = unique_pairs(pairs, num_user_rows, num_item_rows)
  longest_user = int(np.bincount(pairs[:, 0], minlength=1).max(initial=1))
  longest_item = int(np.bincount(pairs[:, 1], minlength=1).max(initial=1))
  if history_chunk is not None:
    check_history_chunk(history_chunk)
    longest_user = min(longest_user, history_chunk)
    longest_item = min(longest_item, history_chunk)
  return [
    FeatureSpec(user, num_user_rows, table=user),
    FeatureSpec(item, num_item_rows, table=item),
    FeatureSpec(
      USER_HISTORY, num_item_rows, sequence_length=longest_user, table=item
    ),
    FeatureSpec(
      ITEM_HISTORY, num_user_rows, sequence_length=longest_item, table=user
    ),
  ]


def _ragged(rows: list) -> tf.RaggedTensor:
  lengths = np.array([len(r) for r in rows], np.int64)
  values = np.concatenate(
    [np.asarray(r, np.int64) for r in rows] + [np.zeros(0, np.int64)]
  )
  return tf.RaggedTensor.from_row_lengths(values, lengths)


def check_history_chunk(history_chunk: int | None) -> None:
  """Raises HistoryChunkError unless `history_chunk` is None or a whole
  number of ids >= 1."""
  if history_chunk is not None and (
    isinstance(history_chunk, bool)
    or not isinstance(history_chunk, (int, np.integer))
    or history_chunk < 1
  ):
    raise HistoryChunkError(
      "ImplicitALSData.history_chunk must be None or a positive whole "
      f"number of ids, got {history_chunk!r}."
    )


def _num_entries(length: int, history_chunk: int | None) -> int:
  """Batch entries of a row with `length` observed pairs (at least one)."""
  if history_chunk is None or length <= history_chunk:
    return 1
  return -(-length // history_chunk)


def row_groups(
  histories: list, batch_size: int, history_chunk: int | None = None
) -> list:
  """Rows 0..len(histories)-1 in order, packed into batches of at most
  `batch_size` entries (a row's chunks never split over two batches).

  Raises:
    HistoryChunkError: a row has more chunks than a batch has entries.
  """
  check_history_chunk(history_chunk)
  groups: list = []
  current: list[int] = []
  used = 0
  for row, history in enumerate(histories):
    need = _num_entries(len(history), history_chunk)
    if need > batch_size:
      raise HistoryChunkError(
        f"iALS batch: row {row} has {len(history)} observed pairs, {need} "
        f"chunks of ImplicitALSData.history_chunk {history_chunk}, more "
        f"than batch_size {batch_size} entries; a row's chunks share one "
        f"batch. Set history_chunk >= {-(-len(history) // batch_size)} or "
        "a larger batch size."
      )
    if used + need > batch_size:
      groups.append(np.array(current, np.int64))
      current, used = [], 0
    current.append(row)
    used += need
  if current:
    groups.append(np.array(current, np.int64))
  return groups


def half_batch(
  side: int,
  rows: np.ndarray,
  histories: list,
  batch_size: int,
  user: str = USER,
  item: str = ITEM,
  history_chunk: int | None = None,
) -> tuple[dict, tf.Tensor]:
  """One batch `(features, labels)` solving `rows` of `side` (padded to
  `batch_size` entries); `histories[r]` the other side's ids row r
  observed, cut into chunks of `history_chunk` ids when longer.

  Raises:
    IALSBatchError: more entries than the batch size, or a row twice.
  """
  rows = np.asarray(rows, np.int64)
  if len(np.unique(rows)) != len(rows):
    raise IALSBatchError(
      "iALS batch: a row appears twice; each step solves DISTINCT rows "
      "(its update sets a row to its solution once)."
    )
  check_history_chunk(history_chunk)
  entry_rows: list[int] = []
  chunks: list = []
  segments: list[int] = []
  counts: list[int] = []
  for row in rows:
    history = histories[row]
    first = len(entry_rows)
    for e in range(_num_entries(len(history), history_chunk)):
      entry_rows.append(row)
      chunks.append(
        history
        if history_chunk is None
        else history[e * history_chunk : (e + 1) * history_chunk]
      )
      segments.append(first)
      counts.append(len(history))
  if len(entry_rows) > batch_size:
    raise IALSBatchError(
      f"iALS batch: {len(rows)} rows take {len(entry_rows)} entries, more "
      f"than batch_size {batch_size}."
    )
  used = len(entry_rows)
  pad = batch_size - used
  ids = np.array(entry_rows + [0] * pad, np.int64)
  zeros = np.zeros(batch_size, np.int64)
  history = _ragged(chunks + [[]] * pad)
  empty = _ragged([[]] * batch_size)
  sides = np.array([side] * used + [PADDING] * pad, np.int32)
  solving_users = side == USER_SIDE
  categorical = {
    user: tf.constant(ids if solving_users else zeros),
    item: tf.constant(zeros if solving_users else ids),
    USER_HISTORY: history if solving_users else empty,
    ITEM_HISTORY: empty if solving_users else history,
  }
  features = {
    "categorical": categorical,
    SIDE: tf.constant(sides),
    COUNTS: tf.constant(np.array(counts + [0] * pad, np.int64)),
    SEGMENT: tf.constant(
      np.array(segments + list(range(used, batch_size)), np.int32)
    ),
  }
  return features, tf.zeros([batch_size], tf.float32)


def gramian_parts(
  other_rows: int, batch_size: int, width: int, steps_multiple: int = 1
) -> list:
  """The other side's row ids 0..other_rows-1, each once, split into the
  Gramian batches of a half: as few steps as hold them at `batch_size *
  width` ids a batch, `steps_multiple` batches a step.

  Batch `r` of each step holds ids = r (mod steps_multiple): with R
  replicas fed consecutive batches, each replica reads the rows its strided
  shard of a row-sharded table owns (no exchange), and 1/R of the table.
  """
  per_step = steps_multiple * batch_size * width
  steps = max(1, -(-other_rows // per_step))
  ids = np.arange(other_rows, dtype=np.int64)
  by_replica = [
    np.array_split(ids[r::steps_multiple], steps) for r in range(steps_multiple)
  ]
  return [by_replica[r][s] for s in range(steps) for r in range(steps_multiple)]


def gramian_batch(
  side: int,
  ids: np.ndarray,
  batch_size: int,
  user: str = USER,
  item: str = ITEM,
) -> tuple[dict, tf.Tensor]:
  """One Gramian batch `(features, labels)`: `ids` of the other side's
  table spread over `batch_size` entries of its history feature;
  `side` is `ITEM_GRAMIAN` or `USER_GRAMIAN`, plus `RESTART` on a half's
  first step."""
  of_items = side - (RESTART if side >= ITEM_GRAMIAN + RESTART else 0)
  of_items = of_items == ITEM_GRAMIAN
  entries = _ragged(np.array_split(np.asarray(ids, np.int64), batch_size))
  empty = _ragged([[]] * batch_size)
  zeros = tf.zeros([batch_size], tf.int64)
  categorical = {
    user: zeros,
    item: zeros,
    USER_HISTORY: entries if of_items else empty,
    ITEM_HISTORY: empty if of_items else entries,
  }
  features = {
    "categorical": categorical,
    SIDE: tf.fill([batch_size], side),
    COUNTS: zeros,
    SEGMENT: tf.range(batch_size, dtype=tf.int32),
  }
  return features, tf.zeros([batch_size], tf.float32)


def _history_width(histories: list, history_chunk: int | None) -> int:
  """The history feature's `sequence_length` (`feature_specs`)."""
  longest = max((len(h) for h in histories), default=1)
  return max(1, min(longest, history_chunk or longest))


class _Half(NamedTuple):
  """What one half solves: its side, its rows' histories, and the Gramian
  batches (side codes and ids) that open it."""

  side: int
  histories: list
  gramian: list


def _halves(
  pairs, num_user_rows, num_item_rows, batch_size, steps_multiple, chunk
) -> list[_Half]:
  pairs = unique_pairs(pairs, num_user_rows, num_item_rows)
  halves = []
  for side, keys, values, rows, code, other_rows in (
    (USER_SIDE, 0, 1, num_user_rows, ITEM_GRAMIAN, num_item_rows),
    (ITEM_SIDE, 1, 0, num_item_rows, USER_GRAMIAN, num_user_rows),
  ):
    histories = _histories(pairs[:, keys], pairs[:, values], rows)
    parts = gramian_parts(
      other_rows,
      batch_size,
      _history_width(histories, chunk),
      steps_multiple,
    )
    gramian = [
      (code + (RESTART if i < steps_multiple else 0), part)
      for i, part in enumerate(parts)
    ]
    halves.append(_Half(side, histories, gramian))
  return halves


def _padded(groups: list, steps_multiple: int) -> list:
  empty = np.zeros(0, np.int64)
  return groups + [empty] * (-len(groups) % steps_multiple)


def steps_per_epoch(
  pairs: np.ndarray,
  num_user_rows: int,
  num_item_rows: int,
  batch_size: int,
  steps_multiple: int = 1,
  history_chunk: int | None = None,
) -> int:
  """The number of batches `epoch_batches` yields for these settings."""
  halves = _halves(
    pairs,
    num_user_rows,
    num_item_rows,
    batch_size,
    steps_multiple,
    history_chunk,
  )
  return sum(
    len(half.gramian)
    + len(
      _padded(
        row_groups(half.histories, batch_size, history_chunk), steps_multiple
      )
    )
    for half in halves
  )


def epoch_batches(
  pairs: np.ndarray,
  num_user_rows: int,
  num_item_rows: int,
  batch_size: int,
  user: str = USER,
  item: str = ITEM,
  steps_multiple: int = 1,
  history_chunk: int | None = None,
) -> Iterator[tuple[dict, tf.Tensor]]:
  """One epoch: the item table's Gramian batches, every user row
  0..num_user_rows-1 in batches, then the user table's Gramian batches and
  every item row (rows without pairs solve to zeros, as in the NumPy iALS).

  The Gramian and the solve batches of each half are each padded with
  all-padding batches to a multiple of `steps_multiple` batches: with R
  replicas fed consecutive batches, pass R so no step mixes a Gramian
  batch with a solve batch or a user batch with an item batch (an item
  solve must see the users of the finished half; the model refuses a
  mixed step). `history_chunk`: see the module docstring.
  """
  halves = _halves(
    pairs,
    num_user_rows,
    num_item_rows,
    batch_size,
    steps_multiple,
    history_chunk,
  )
  for half in halves:
    for code, ids in half.gramian:
      yield gramian_batch(code, ids, batch_size, user, item)
    groups = row_groups(half.histories, batch_size, history_chunk)
    for rows in _padded(groups, steps_multiple):
      yield half_batch(
        half.side,
        rows,
        half.histories,
        batch_size,
        user,
        item,
        history_chunk,
      )
