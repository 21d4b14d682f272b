"""Every batch of an iALS epoch as NumPy arrays, planned once.

An epoch (`recsys.data.ials_batches`) is the same every time: the item
Gramian batches, the user solves, the user Gramian batches, the item
solves. `plan_epoch` lays all of it out once, vectorized, as per-entry
arrays (entry e of batch b at index b * B + e) and one array of ids that
the entries slice; `recsys.data.ials_dataset` turns the plan into batches
with TF ops, so an epoch's input costs no Python loop.

Example:
  >>> plan = plan_epoch(pairs, 944, 1683, batch_size=256, steps_multiple=2)
  >>> plan.num_batches, plan.entries.side.reshape(plan.num_batches, 256)[0]
"""

from typing import NamedTuple

import numpy as np

from recsys.data import ials_batches as names


class Entries(NamedTuple):
  """Batches' entries (entry e of batch b at index b * B + e).

  Attributes:
    side: `ials_side` of each entry (a Gramian batch's code on every
      entry of it).
    row: the id of the row an entry solves (0 on other entries).
    counts: `ials_counts`, the solved row's number of observed pairs.
    segment: `ials_segment`, the batch position of the row's first entry.
    starts, lengths: the slice of the plan's `ids` an entry's history
      feature holds.
    of_users: per batch, whether it belongs to the user half (its ids go to
      the user history feature).
  """

  side: np.ndarray
  row: np.ndarray
  counts: np.ndarray
  segment: np.ndarray
  starts: np.ndarray
  lengths: np.ndarray
  of_users: np.ndarray


class EpochPlan(NamedTuple):
  """One epoch's batches.

  Attributes:
    batch_size: entries per batch B.
    entries: every batch's entries, `num_batches * batch_size` of them.
    ids: every user's items, every item's users, then the Gramian batches'
      ids, which the entries slice.
  """

  batch_size: int
  entries: Entries
  ids: np.ndarray

  @property
  def num_batches(self) -> int:
    return len(self.entries.of_users)

  def step_kinds(self, steps_multiple: int) -> np.ndarray:
    """Each step's kind of batch (`ials_side`) when `steps_multiple`
    replicas take consecutive batches: its batches' own, all-padding ones
    (PADDING, the lowest) going with any."""
    first = self.entries.side[:: self.batch_size]
    return first.reshape(-1, steps_multiple).max(1)


def gramian_parts(
  other_rows: int, batch_size: int, width: int, steps_multiple: int = 1
) -> list:
  """The other side's row ids 0..other_rows-1, each once, split into the
  Gramian batches of a half: as few steps as hold them at `batch_size *
  width` ids a batch, `steps_multiple` batches a step.

  Batch `r` of each step holds ids = r (mod steps_multiple): with R
  replicas fed consecutive batches, each replica reads the rows its strided
  shard of a row-sharded table owns (no exchange), and 1/R of the table;
  and its ids of a step are strided over the whole table, so contiguous
  shards each own an even share of them too.
  """
  per_step = steps_multiple * batch_size * width
  steps = max(1, -(-other_rows // per_step))
  ids = np.arange(other_rows, dtype=np.int64)
  by_replica = [
    [ids[r::steps_multiple][s::steps] for s in range(steps)]
    for r in range(steps_multiple)
  ]
  return [by_replica[r][s] for s in range(steps) for r in range(steps_multiple)]


def _batch_of_rows(need: np.ndarray, batch_size: int) -> np.ndarray:
  """Each row's batch, rows packed in order at most `batch_size` entries a
  batch (`need[r]` <= `batch_size` entries of row r, never split over two
  batches)."""
  if len(need) == 0 or need.max() == 1:
    return np.arange(len(need), dtype=np.int64) // batch_size
  batch = np.empty(len(need), np.int64)
  current = used = 0
  for r, n in enumerate(need.tolist()):  # sequential: bins of whole rows
    if used + n > batch_size:
      current, used = current + 1, 0
    batch[r] = current
    used += n
  return batch


def _solve_entries(
  side: int,
  offsets: np.ndarray,
  base: int,
  batch_size: int,
  steps_multiple: int,
  width: int,
) -> Entries:
  """One half's solve batches: rows 0..len(offsets)-2, row r's history
  `ids[base + offsets[r] : base + offsets[r + 1]]`, in entries of at most
  `width` ids (`ials_batches.history_width`): the rows whose entries fit a
  batch packed into batches, then each longer row in steps of its own
  (`_long_entries`)."""
  lengths = np.diff(offsets)
  need = np.maximum(1, -(-lengths // width))
  fits = need <= batch_size
  rows = _spread(np.flatnonzero(fits), steps_multiple)
  batch_of_row = _batch_of_rows(need[rows], batch_size)
  batches = int(batch_of_row[-1]) + 1 if len(rows) else 0
  batches += -batches % steps_multiple
  total = batches * batch_size
  # Entry k of row j (of `rows`): the row's chunk k.
  of_row = np.repeat(np.arange(len(rows)), need[rows])
  entry_row = rows[of_row]
  first_of_row = np.cumsum(need[rows]) - need[rows]
  chunk_index = np.arange(len(entry_row)) - first_of_row[of_row]
  entry_batch = batch_of_row[of_row]
  # Position in the batch: entries of a batch are consecutive.
  batch_first = np.searchsorted(entry_batch, np.arange(batches))
  position = np.arange(len(entry_row)) - batch_first[entry_batch]
  index = entry_batch * batch_size + position
  out = _padding(total, batch_size)
  out.side[index] = side
  out.row[index] = entry_row
  out.counts[index] = lengths[entry_row]
  out.segment[index] = position - chunk_index
  start = offsets[entry_row] + chunk_index * width
  out.starts[index] = base + start
  out.lengths[index] = np.clip(offsets[entry_row + 1] - start, 0, width)
  out = out._replace(of_users=np.full(batches, side == names.USER_SIDE))
  long_rows = [
    _long_entries(
      side, int(r), offsets, base, batch_size, steps_multiple, width
    )
    for r in np.flatnonzero(~fits)
  ]
  return _joined([out, *long_rows])


def _spread(rows: np.ndarray, parts: int) -> np.ndarray:
  """`rows` (ascending) reordered to take one row of each of `parts` equal
  runs in turn: any stretch of the order holds about as many rows of each
  run (the contiguous shards of a row-sharded table) and of each residue
  mod `parts` (the strided shards), so a batch's solved rows, which
  alone carry gradients, go evenly to their owners (the all-to-all sized
  for an even share)."""
  if parts <= 1 or len(rows) <= parts:
    return rows
  per_part = -(-len(rows) // parts)
  grid = np.full(parts * per_part, -1, np.int64)
  grid[: len(rows)] = rows
  order = grid.reshape(parts, per_part).T.reshape(-1)
  return order[order >= 0]


def _long_entries(
  side: int,
  row: int,
  offsets: np.ndarray,
  base: int,
  batch_size: int,
  steps_multiple: int,
  width: int,
) -> Entries:
  """Row `row`'s long-history steps: its chunks over whole steps of
  `steps_multiple` batches (`ials_batches.USER_LONG` / `ITEM_LONG`, plus
  RESTART on the first step): step s of S holds chunks s, s + S, ...,
  the j-th of them in batch j mod R, so each batch's ids spread over the
  row's whole history (sorted ids: over the owners of contiguous shards
  too). The last step's first entry carries the row and its count, and
  solves it."""
  code = names.USER_LONG if side == names.USER_SIDE else names.ITEM_LONG
  length = int(offsets[row + 1] - offsets[row])
  chunks = -(-length // width)
  per_step = steps_multiple * batch_size
  steps = -(-chunks // per_step)
  total = steps * per_step
  # Entry e of step s (batch b = e // B of the step, position e % B)
  # holds the step's j-th chunk, j = position * R + b.
  entry = np.arange(total)
  step, in_step = entry // per_step, entry % per_step
  j = (in_step % batch_size) * steps_multiple + in_step // batch_size
  chunk = step + j * steps
  starts = offsets[row] + chunk * width
  out = _padding(total, batch_size)
  out.side[:] = np.where(step == 0, code + names.RESTART, code)
  out.starts[:] = base + np.minimum(starts, offsets[row + 1])
  out.lengths[:] = np.clip(offsets[row + 1] - starts, 0, width)
  solver = (steps - 1) * per_step  # replica 0's first entry, last step
  out.row[solver] = row
  out.counts[solver] = length
  return out._replace(
    of_users=np.full(total // batch_size, side == names.USER_SIDE)
  )


def _joined(pieces: list) -> Entries:
  """Batches of several `Entries` one after the other."""
  return Entries(*(np.concatenate(arrays) for arrays in zip(*pieces)))


def _padding(total: int, batch_size: int) -> Entries:
  """`total` padding entries (each its own segment, no history)."""
  return Entries(
    side=np.full(total, names.PADDING, np.int32),
    row=np.zeros(total, np.int64),
    counts=np.zeros(total, np.int64),
    segment=(np.arange(total) % batch_size).astype(np.int32),
    starts=np.zeros(total, np.int64),
    lengths=np.zeros(total, np.int64),
    of_users=np.zeros(0, bool),
  )


def _gramian_entries(
  code: int, parts: list, base: int, batch_size: int, steps_multiple: int
) -> Entries:
  """A half's Gramian batches: part p's ids (at `base` + their offset in
  the concatenated parts) spread over batch p's entries."""
  out = _padding(len(parts) * batch_size, batch_size)
  sizes = np.array([len(p) for p in parts], np.int64)
  part_start = base + np.cumsum(sizes) - sizes
  # np.array_split's sizes: the first (n mod B) entries hold one more.
  small, extra = sizes // batch_size, sizes % batch_size
  entry = np.arange(batch_size)
  lengths = small[:, None] + (entry[None, :] < extra[:, None])
  starts = part_start[:, None] + np.cumsum(lengths, 1) - lengths
  first = np.arange(len(parts)) < steps_multiple
  side = np.where(first, code + names.RESTART, code).astype(np.int32)
  return out._replace(
    side=np.repeat(side, batch_size),
    starts=starts.reshape(-1),
    lengths=lengths.reshape(-1),
    of_users=np.full(len(parts), code == names.ITEM_GRAMIAN),
  )


def plan_epoch(
  pairs: np.ndarray,
  num_user_rows: int,
  num_item_rows: int,
  batch_size: int,
  steps_multiple: int = 1,
  history_chunk: int | None = None,
) -> EpochPlan:
  """The epoch of `recsys.data.ials_batches` for these pairs and settings.

  Each half's Gramian and solve batches are each padded with all-padding
  batches to a multiple of `steps_multiple` (the number of replicas fed
  consecutive batches: no step mixes kinds of batch); a row longer than a
  batch's entries takes whole steps of its own after them.

  Raises:
    IALSBatchError: ids out of range.
    HistoryChunkError: a bad `history_chunk`.
  """
  names.check_history_chunk(history_chunk)
  pairs = names.unique_pairs(pairs, num_user_rows, num_item_rows)
  pieces, ids, used = [], [], 0
  halves = (
    (names.USER_SIDE, 0, num_user_rows, names.ITEM_GRAMIAN, num_item_rows),
    (names.ITEM_SIDE, 1, num_item_rows, names.USER_GRAMIAN, num_user_rows),
  )
  for side, key, rows, code, other_rows in halves:
    order = np.argsort(pairs[:, key], kind="stable")
    history_ids = pairs[order, 1 - key]
    offsets = np.searchsorted(pairs[order, key], np.arange(rows + 1))
    width = names.history_width(
      int(np.diff(offsets).max(initial=1)), history_chunk
    )
    parts = gramian_parts(other_rows, batch_size, width, steps_multiple)
    gramian_ids = np.concatenate(parts)
    pieces.append(
      _gramian_entries(code, parts, used, batch_size, steps_multiple)
    )
    ids.append(gramian_ids)
    used += len(gramian_ids)
    pieces.append(
      _solve_entries(side, offsets, used, batch_size, steps_multiple, width)
    )
    ids.append(history_ids)
    used += len(history_ids)
  return EpochPlan(batch_size, _joined(pieces), np.concatenate(ids))
