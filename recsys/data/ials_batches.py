"""What implicit ALS trains on: its features, their names and checks.

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
being solved carries id 0 and gets a zero gradient. A row whose history
needs more entries than a batch holds is solved in **long-history steps**
of its own (`USER_LONG`, `ITEM_LONG`): its chunks fill every replica's
batch, their sums are added over the replicas and steps, and its last step
solves it; so a few rows observed by most of the other side (a catalogue's
hits) need no chunk as wide as their history. The epoch is planned
once in NumPy (`recsys.data.ials_plan`) and built by `tf.data`
(`recsys.data.ials_dataset`).

Example:
  >>> specs = feature_specs(pairs, num_user_rows=944, num_item_rows=1683)
  >>> for features, labels in ials_dataset.epoch_batches(
  ...     pairs, 944, 1683, 256): ...
"""

import numpy as np

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
#: A long-history batch's `ials_side` (user rows / item rows): chunks of ONE
#: row whose history needs more entries than a batch holds, in whole steps
#: of their own; their sums are added over the replicas and steps (RESTART
#: on the row's first step), and the entry carrying the row's id (and its
#: `ials_counts`) solves it in the row's last step.
USER_LONG, ITEM_LONG = 6, 7
#: The `ials_side` values whose entries solve user rows / item rows.
SOLVES_USERS = (USER_SIDE, USER_LONG, USER_LONG + RESTART)
SOLVES_ITEMS = (ITEM_SIDE, ITEM_LONG, ITEM_LONG + RESTART)
#: The `ials_side` values whose steps add to sums over the replicas (a
#: Gramian's, a long row's): only those steps all-reduce them.
SUMMED_KINDS = tuple(
  code + restart
  for code in (ITEM_GRAMIAN, USER_GRAMIAN, USER_LONG, ITEM_LONG)
  for restart in (0, RESTART)
)
#: Every `ials_side` value: PADDING .. ITEM_LONG + RESTART.
NUM_KINDS = ITEM_LONG + RESTART - PADDING + 1


class IALSBatchError(DataFormatError):
  """Pairs that iALS cannot train on (ids out of range): the data, not a
  setting (exit status 1)."""


class HistoryChunkError(SettingsError, IALSBatchError):
  """`history_chunk` is no number of ids: a setting (exit status 2)."""


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
  user: str = USER,
  item: str = ITEM,
  history_chunk: int | None = None,
) -> list:
  """The four features of an iALS batch (tables named after `user` and
  `item`, the one-hot id features); histories padded to the longest, or
  to `history_chunk` when that is shorter."""
  pairs = unique_pairs(pairs, num_user_rows, num_item_rows)
  check_history_chunk(history_chunk)
  longest_user, longest_item = (
    history_width(
      int(np.bincount(pairs[:, c], minlength=1).max()), history_chunk
    )
    for c in (0, 1)
  )
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


def history_width(longest: int, history_chunk: int | None) -> int:
  """A history feature's `sequence_length`: the longest history, or the
  chunk when that is shorter (at least 1)."""
  return max(1, min(longest, history_chunk or longest))


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
