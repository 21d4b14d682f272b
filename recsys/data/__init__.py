"""Input pipelines: synthetic data with a known optimum, Criteo TSV, MovieLens.

Every source yields `(features, labels)` batches:

    features = {
      "dense": float32 [B, num_dense],              # if the source has any
      "categorical": {name: ids},                   # int64 [B], or ragged bags
      "weights": {name: float32 like ids},          # only for weighted features
      "candidate_sampling_probability": float32 [B] # retrieval sources only
    }
    labels = float32 [B]

and describes its categorical features with `feature_specs` (`FeatureSpec`)
and `num_dense`. Ids are in `[0, vocabulary_size)`, or raw int64 values
where the spec says `raw_ids` (SyntheticCTR's drifting features, MovieLens
with `raw_ids`: for dynamic-vocabulary tables or hashing). File-backed
sources also have a `raw_parser()` (`RawParser`):
the TF transformation of raw values into `features` that their reader and the
export's raw serving signature share.
`dataset(batch_size, training=..., input_context=...)` takes the PER-REPLICA
batch size; `recsys.run.input.distribute()` wires a source into
`strategy.distribute_datasets_from_function` (data never imports training).
"""

from recsys.data.criteo import (
  CATEGORICAL_NAMES,
  KAGGLE_VOCAB_SIZES,
  MLPERF_VOCAB_SIZES,
  CriteoConfigError,
  CriteoTSV,
  MalformedLines,
)
from recsys.data.errors import DataFormatError, DatasetNotFoundError
from recsys.data.from_dataset import DatasetSource
from recsys.data.movielens import MovieLens, MovieLensConfigError
from recsys.data.pipeline import DataSource, InvalidBatchSizeError
from recsys.data.raw import RawParser
from recsys.data.synthetic_ctr import SyntheticConfigError, SyntheticCTR
from recsys.data.synthetic_retrieval import (
  SyntheticRetrieval,
  SyntheticRetrievalConfigError,
)
from recsys.feature_spec import FeatureSpec

__all__ = [
  "CATEGORICAL_NAMES",
  "CriteoConfigError",
  "CriteoTSV",
  "DataFormatError",
  "DataSource",
  "DatasetNotFoundError",
  "DatasetSource",
  "FeatureSpec",
  "InvalidBatchSizeError",
  "KAGGLE_VOCAB_SIZES",
  "MLPERF_VOCAB_SIZES",
  "MalformedLines",
  "MovieLens",
  "MovieLensConfigError",
  "RawParser",
  "SyntheticCTR",
  "SyntheticConfigError",
  "SyntheticRetrieval",
  "SyntheticRetrievalConfigError",
]
