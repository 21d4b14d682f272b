"""What a data source tells the model about its categorical features.

A `FeatureSpec` is the contract between `recsys.data` (which knows the
vocabularies and bag shapes) and `recsys.features` (which turns specs into
`tf.tpu.experimental.embedding.FeatureConfig`s for the embedding backend).
It sits below both, so neither imports the other for it.
"""

import dataclasses

from recsys.errors import SettingsError


class FeatureSpecError(SettingsError):
  """A data source described a feature it cannot deliver (size, bag width)."""


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """One categorical feature as a data source delivers it.

  Attributes:
    name: key in `features["categorical"]`.
    vocabulary_size: ids are in [0, vocabulary_size); with `raw_ids`, the
      suggested capacity (rows) of the feature's table instead.
    multi_hot: False -> int64 `[B]` ids; True -> int64 RaggedTensor `[B, None]`.
    max_ids: the longest bag the source produces (a static padding width for
      backends that need one); 1 for one-hot features.
    weighted: `features["weights"][name]` holds float32 weights shaped like
      the ids.
    sequence_length: > 0 for ordered sequences (embedded as `[B, L, D]`).
    table: name of the table to share with other features (default: own table).
    raw_ids: the ids are RAW int64 values (any int64, large, not contiguous,
      not known in advance: user ids as the files hold them, fingerprints,
      ids that keep appearing), not ids in [0, vocabulary_size). A model
      can use them only through a dynamic-vocabulary table (an index maps
      raw ids to `vocabulary_size` rows, admitting and evicting) or by
      hashing them into `vocabulary_size` buckets (e.g.
      `tf.math.floormod(ids, vocabulary_size)`); used as row numbers they
      are out of range.
  """

  name: str
  vocabulary_size: int
  multi_hot: bool = False
  max_ids: int = 1
  weighted: bool = False
  sequence_length: int = 0
  table: str | None = None
  raw_ids: bool = False

  def __post_init__(self):
    if self.vocabulary_size < 1:
      raise FeatureSpecError(
        f"feature {self.name!r}: vocabulary_size must be >= 1, "
        f"got {self.vocabulary_size}."
      )
    if self.max_ids < 1:
      raise FeatureSpecError(
        f"feature {self.name!r}: max_ids must be >= 1, got {self.max_ids}."
      )
