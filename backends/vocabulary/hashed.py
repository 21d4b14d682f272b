"""Raw ids hashed into a table's rows: the classic way, and the baseline a
dynamic vocabulary is measured against.

`HashedIds` is a table's policy next to `DynamicVocabulary`
(`EmbeddingPlacement.vocabularies`): every raw id (any int64, or a string,
fingerprinted) reads row `splitmix64(id ^ salt(seed)) mod vocabulary_size`.
Nothing is admitted, evicted or reset, and unrelated ids share a row when
they hash alike: what a fixed-size table fed by `tf.strings.to_hash_bucket`
or Criteo-style hashing does, through the same stage (`map_ids`), so the
two can be compared on the same data at the same table memory by changing
one gin line.

Example:
  >>> index = HashedIndex("items", 1000, HashedIds(seed=3))
  >>> index.lookup(tf.constant([2**40, -5], tf.int64))   # rows in [0, 1000)
"""

import dataclasses
import numbers
from typing import Any

import tensorflow as tf

from backends.vocabulary import index as index_lib
from backends.vocabulary import policy as policy_lib

#: The salt's purpose number (distinct from the dynamic index's hashes).
_HASH_PURPOSE = 0x4A5E


@dataclasses.dataclass(frozen=True)
class HashedIds:
  """A table whose raw ids are hashed into its rows (collisions and all).

  Attributes:
    seed: mixed into the hash (any int64): another seed, another
      assignment of ids to rows.
  """

  seed: int = 0
  #: Every id has a row: none reads a default.
  unknown = None

  def __post_init__(self) -> None:
    if isinstance(self.seed, bool) or not isinstance(
      self.seed, numbers.Integral
    ):
      raise policy_lib.VocabularySettingError(
        f"HashedIds.seed = {self.seed!r}; use an integer."
      )

  def index_bytes(self, vocabulary_size: int) -> int:
    """None: hashing keeps no state."""
    del vocabulary_size
    return 0

  def check(self, table: str, vocabulary_size: int) -> None:
    """Raises naming `table` when it has no row to hash into."""
    if vocabulary_size < 1:
      raise policy_lib.VocabularySettingError(
        f"table {table!r}: TableConfig.vocabulary_size = {vocabulary_size}; "
        "hashed ids need at least 1 row."
      )


class HashedIndex(tf.Module):
  """The stateless "index" of a `HashedIds` table (the interface of
  `VocabularyIndex`: `update`, `lookup`, `counters`, `default_row`)."""

  def __init__(self, table: str, vocabulary_size: int, policy: HashedIds):
    super().__init__(name=None)
    policy.check(table, vocabulary_size)
    self.table_name = table
    self.vocabulary_size = int(vocabulary_size)
    self.policy = policy
    self._salt = index_lib.salt(policy.seed, _HASH_PURPOSE)

  @property
  def default_row(self) -> None:
    return None

  def lookup(self, ids: tf.Tensor) -> tf.Tensor:
    """int64: each id's row (same shape as `ids`, flattened)."""
    keys = index_lib.keys_of(self.table_name, ids)
    hashed = index_lib.salted(keys, self._salt)
    rows = tf.math.floormod(
      hashed, tf.constant(self.vocabulary_size, tf.uint64)
    )
    return tf.cast(rows, tf.int64)

  def update(self, ids: tf.Tensor, step: tf.Tensor) -> index_lib.IndexUpdate:
    """The rows (`lookup`); no row is ever reset."""
    del step
    return index_lib.IndexUpdate(
      rows=self.lookup(ids), reset_rows=tf.zeros([0], tf.int64)
    )

  def update_pieces(
    self, pieces: list[tuple[Any, tf.Tensor | None]], step: tf.Tensor
  ) -> tuple[list[tf.Tensor], tf.Tensor]:
    """Each piece's rows in its shape (`VocabularyIndex.update_pieces`;
    a padded piece's padding hashed too: no lookup reads it)."""
    del step
    rows = [tf.reshape(self.lookup(ids), tf.shape(ids)) for ids, _ in pieces]
    return rows, tf.zeros([0], tf.int64)

  def counters(self) -> dict[str, tf.Tensor]:
    """None: hashing keeps no state to count."""
    return {}

  def index_bytes(self) -> int:
    return 0

  def state_shapes(self) -> dict[str, tuple[int, ...]]:
    """None: nothing of it is checkpointed."""
    return {}
