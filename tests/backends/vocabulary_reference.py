"""A NumPy/dict twin of `backends.vocabulary.VocabularyIndex`, written from
its specification (the module docstring of `backends/vocabulary/index.py`),
without TensorFlow: the tests feed both the same ids and compare every
output and every piece of state exactly.

Ids are Python ints in the int64 range (string ids: the test gives their
64-bit fingerprints). Steps stay small (no int64 wrap-around here).
"""

import dataclasses

import numpy as np

MASK = 2**64 - 1


def splitmix64(x: int) -> int:
  """splitmix64's finalizer of x's 64 bits (Steele, Lea, Flood 2014)."""
  z = (x + 0x9E3779B97F4A7C15) & MASK
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
  return z ^ (z >> 31)


def _salt(seed: int, purpose: int) -> int:
  return splitmix64((seed & MASK) ^ splitmix64(purpose))


@dataclasses.dataclass
class Update:
  rows: list[int]
  reset_rows: list[int]


class ReferenceIndex:
  """The index's state and `update`, one id at a time.

  Args:
    vocabulary_size: the table's rows.
    policy: a `DynamicVocabulary` (only its plain fields are read).
  """

  def __init__(self, vocabulary_size: int, policy) -> None:
    self.eviction = str(policy.eviction.value)
    unknown_row = str(policy.unknown.value) == "unknown_row"
    self.capacity = vocabulary_size - 1 if unknown_row else vocabulary_size
    self.default_row = vocabulary_size - 1 if unknown_row else None
    width = policy.sketch_width
    if width == 0 and policy.admit_after == 1:
      width = 16  # every id admitted at first sight: the sketch decides nothing
    elif width == 0:
      width = 1
      while width < max(1024, 4 * self.capacity):
        width *= 2
    self.width = width
    self.admit_after = policy.admit_after
    self.admit_probability = policy.admit_probability
    self.max_age = policy.max_age
    self.evict_every = policy.evict_every
    self.salts = [_salt(policy.seed, p) for p in (0, 1)]
    self.admit_salt = _salt(policy.seed, 2)
    r = self.capacity
    self.keys = np.zeros(r, np.int64)
    self.occupied = np.zeros(r, bool)
    self.counts = np.zeros(r, np.int64)
    self.last_seen = np.zeros(r, np.int64)
    self.sketch = np.zeros((2, width), np.int64)
    self.table: dict[int, int] = {}
    self.counters = dict(
      rows_in_use=0,
      capacity=r,
      admissions=0,
      evictions=0,
      refused=0,
      default_hits=0,
    )

  def _bucket(self, key: int, row: int) -> int:
    return splitmix64((key & MASK) ^ self.salts[row]) % self.width

  def _lucky(self, key: int, step: int) -> bool:
    if self.admit_probability == 1:
      return True
    inner = splitmix64((key & MASK) ^ self.admit_salt)
    draw = splitmix64(inner ^ (step & MASK)) >> 11
    return draw < int(self.admit_probability * 2**53)

  def _free(self, row: int) -> None:
    del self.table[int(self.keys[row])]
    self.occupied[row] = False
    self.counters["rows_in_use"] -= 1
    self.counters["evictions"] += 1

  def lookup(self, ids: list[int]) -> list[int]:
    return [self.table.get(i, -1) for i in ids]

  def update(self, ids: list[int], step: int) -> Update:
    # 1. distinct ids in order of first appearance, with occurrences
    occ: dict[int, int] = {}
    for i in ids:
      occ[i] = occ.get(i, 0) + 1
    # 2. known ids
    for i, n in occ.items():
      if i in self.table:
        row = self.table[i]
        self.counts[row] += n
        self.last_seen[row] = step
    # 3. age sweep
    if self.eviction == "age" and step % self.evict_every == 0:
      for row in range(self.capacity):
        last = int(self.last_seen[row])
        if self.occupied[row] and last != step and step - last > self.max_age:
          self._free(row)
    # 4. the sketch and the candidates
    candidates = []
    for i, n in occ.items():
      if i in self.table:
        continue
      estimate = None
      for r in (0, 1):
        b = self._bucket(i, r)
        self.sketch[r, b] += n
        c = int(self.sketch[r, b])
        estimate = c if estimate is None else min(estimate, c)
      if estimate >= self.admit_after and self._lucky(i, step):
        candidates.append(i)
      else:
        self.counters["refused"] += n
    # 5. rows for the candidates
    free = [r for r in range(self.capacity) if not self.occupied[r]]
    victims = []
    if len(candidates) > len(free) and self.eviction != "none":
      score = self.counts if self.eviction == "lfu" else self.last_seen
      eligible = [
        r
        for r in range(self.capacity)
        if self.occupied[r] and self.last_seen[r] != step
      ]
      eligible.sort(key=lambda r: (int(score[r]), r))
      victims = eligible[: len(candidates) - len(free)]
    reset = []
    for k, i in enumerate(candidates):
      if k < len(free):
        row = free[k]
        self.counters["rows_in_use"] += 1
      elif k - len(free) < len(victims):
        row = victims[k - len(free)]
        del self.table[int(self.keys[row])]
        self.counters["evictions"] += 1
      else:
        self.counters["refused"] += occ[i]
        continue
      self.table[i] = row
      self.keys[row] = i
      self.occupied[row] = True
      self.counts[row] = occ[i]
      self.last_seen[row] = step
      self.counters["admissions"] += 1
      reset.append(row)
    # 6. the rows read
    rows = self.lookup(ids)
    self.counters["default_hits"] += sum(1 for r in rows if r < 0)
    return Update(rows=rows, reset_rows=reset)

  def mapping(self) -> tuple[list[int], list[int]]:
    """(keys, rows) of every admitted id, by row."""
    pairs = sorted((row, key) for key, row in self.table.items())
    return [k for _, k in pairs], [r for r, _ in pairs]


class ReferenceShardedIndex:
  """`backends.vocabulary.ShardedIndex` from its specification (the module
  docstring of `backends/vocabulary/sharded.py`): an id's shard by its
  hash, each shard a `ReferenceIndex` over its contiguous rows fed its ids
  in order, rows shifted by the shard's first row."""

  def __init__(self, vocabulary_size: int, policy) -> None:
    unknown_row = str(policy.unknown.value) == "unknown_row"
    rows = vocabulary_size - 1 if unknown_row else vocabulary_size
    count = policy.shards
    self.bounds = [s * rows // count for s in range(count + 1)]
    self.default_row = vocabulary_size - 1 if unknown_row else None
    self.salt = _salt(policy.seed, 3)
    shard = dataclasses.replace(policy, shards=1, unknown="zeros")
    self.shards = [
      ReferenceIndex(b - a, shard) for a, b in zip(self.bounds, self.bounds[1:])
    ]

  def shard(self, key: int) -> int:
    return splitmix64((key & MASK) ^ self.salt) % len(self.shards)

  def update(self, ids: list[int], step: int) -> Update:
    mine = [
      [i for i in ids if self.shard(i) == s] for s in range(len(self.shards))
    ]
    got = [index.update(part, step) for index, part in zip(self.shards, mine)]
    taken = [iter(u.rows) for u in got]
    rows = []
    for i in ids:
      s = self.shard(i)
      row = next(taken[s])
      rows.append(row + self.bounds[s] if row >= 0 else -1)
    reset = [r + b for u, b in zip(got, self.bounds) for r in u.reset_rows]
    return Update(rows=rows, reset_rows=reset)

  @property
  def counters(self) -> dict[str, int]:
    each = [index.counters for index in self.shards]
    return {name: sum(c[name] for c in each) for name in each[0]}

  def mapping(self) -> tuple[list[int], list[int]]:
    keys, rows = [], []
    for index, begin in zip(self.shards, self.bounds):
      k, r = index.mapping()
      keys += k
      rows += [x + begin for x in r]
    return keys, rows
