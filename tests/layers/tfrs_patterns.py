"""TFRS's tutorial models, written anew, with the embedding layer swapped.

Each pattern follows one TFRS tutorial's model shape (not its code): the
TPU-embedding-layer tutorial, basic ranking, basic retrieval (with
`FactorizedTopK` and a `BruteForce` index), DCN, multitask, listwise
ranking and featurization. Every model is a subclassed `tfrs.models.Model`
whose embedding layers are first called inside `fit`'s replica step.

`make_embedding(feature_config)` builds the embedding layer: the library's
`recsys.layers.Embedding`, or `ExplicitEmbedding`, the reference, which runs
the backend's documented loop (`lookup(..., training=True)`, then
`apply_gradients` with the tape's activation gradients) in `reference_fit`.

Ids: the raw data hold strings (users, movies) and numbers; a pattern's
`lookups` turn them into ids. They run inside the model (as the tutorials
do) or, for XLA-compiled steps, which cannot run string ops, in the
dataset (`preprocess`).
"""

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow_recommenders as tfrs

import backends
from recsys._keras import keras, tf

E = tf.tpu.experimental.embedding
USERS = [f"u{i}" for i in range(9)]
MOVIES = [f"m{i}" for i in range(13)]
LIST = 3  # movies per list (listwise ranking)
WORDS = ["good", "bad", "space", "love", "war", "night"]


def raw_data(n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
  """Ratings with a planted structure, so that the loss can fall."""
  rng = np.random.default_rng(seed)
  user = rng.integers(0, len(USERS), n)
  movie = rng.integers(0, len(MOVIES), (n, LIST))
  taste = rng.normal(size=len(USERS))
  appeal = rng.normal(size=len(MOVIES))
  rating = 3.0 + taste[user][:, None] + appeal[movie]
  words = rng.integers(0, len(WORDS), (n, 2))
  return {
    "user_id": np.array(USERS)[user],
    "user_number": (user + 1).astype("float32"),  # ids as to_number gives
    "movie_title": np.array(MOVIES)[movie[:, 0]],
    "movie_number": (movie[:, 0] + 1).astype("float32"),
    "movie_list": np.array(MOVIES)[movie],
    "rating": rating[:, 0].astype("float32"),
    "rating_list": rating.astype("float32"),
    "gender": (user % 2).astype("int64"),
    "age_bucket": (user * 7 % 60 // 10).astype("int64"),
    "timestamp": rng.uniform(0, 1e6, n).astype("float32"),
    "title_words": np.array(
      [" ".join(np.array(WORDS)[w]) for w in words], dtype=object
    ),
  }


def table(vocab: int, dim: int, name: str, combiner: str = "mean") -> Any:
  return E.TableConfig(vocab, dim, name=name, combiner=combiner)


class _Recorder(threading.local):
  """Per replica thread: the training lookups of the running step."""

  lookups: list | None = None


class ExplicitEmbedding(keras.layers.Layer):
  """The reference embedding layer: the backend's own documented loop.

  A lookup made while `RECORDER.lookups` is a list (set per replica
  thread) is a training lookup, recorded so that the reference loop
  applies the tape's activation gradients with `backend.apply_gradients`;
  otherwise a plain lookup.
  """

  RECORDER = _Recorder()

  def __init__(self, feature_config: Any, optimizer: Any, **kwargs: Any):
    super().__init__(autocast=False, **kwargs)
    self.backend = backends.create(
      feature_config, optimizer, backend="tensorcore"
    )

  def build(self, input_shape: Any) -> None:
    self.backend.build()
    super().build(input_shape)

  def call(self, features: Any, training: Any = None) -> Any:
    features = tf.nest.map_structure(_int_ids, features)
    if ExplicitEmbedding.RECORDER.lookups is None:
      return self.backend.lookup(features)
    acts = self.backend.lookup(features, training=True)
    ExplicitEmbedding.RECORDER.lookups.append((self, acts))
    return acts


def _int_ids(ids: Any) -> Any:
  if isinstance(ids, tf.RaggedTensor):
    return ids.with_flat_values(tf.cast(ids.flat_values, tf.int64))
  return tf.cast(ids, tf.int64)


@dataclasses.dataclass
class Pattern:
  """One tutorial's model: how to build it and what it reads."""

  name: str
  build: Callable[..., tfrs.models.Model]
  # Raw feature -> makes its id lookup from (raw data, static shapes?).
  lookups: dict[str, Callable[[dict[str, np.ndarray], bool], Callable]]
  retrieval: bool = False  # in-batch negatives: per replica under fit


def string_lookup(vocab: list[str]) -> Callable:
  def make(data, static):
    del data, static
    return keras.layers.StringLookup(vocabulary=vocab)

  return make


def words_lookup(data: dict[str, np.ndarray], static: bool) -> Callable:
  """Ragged word ids, or `[B, 2]` for a compiled step (every title here has
  two words, so the bags are the same)."""
  vectorize = keras.layers.TextVectorization(
    ragged=not static, output_sequence_length=2 if static else None
  )
  vectorize.adapt(data["title_words"])
  return vectorize


class _Base(tfrs.models.Model):
  """Applies the lookups (unless the dataset did) before `compute`."""

  def __init__(self, lookups: dict[str, Callable] | None):
    super().__init__()
    self.lookups = lookups

  def ids(self, features: dict[str, Any]) -> dict[str, Any]:
    if not self.lookups:
      return features
    return {
      k: (self.lookups[k](v) if k in self.lookups else v)
      for k, v in features.items()
    }

  def compute_loss(self, features, training=False):
    return self.loss_of(self.ids(features), training)


def _score_head() -> keras.Sequential:
  """The tutorials' small rating/score head: Dense(8, relu) -> Dense(1)."""
  return keras.Sequential(
    [keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
  )


def _mse_task(**kwargs: Any) -> tfrs.tasks.Ranking:
  # Reduction.SUM: TFRS's tasks under a distribution strategy need it.
  return tfrs.tasks.Ranking(
    loss=keras.losses.MeanSquaredError(reduction=keras.losses.Reduction.SUM),
    metrics=[keras.metrics.RootMeanSquaredError()],
    **kwargs,
  )


class TpuTutorial(_Base):
  """The TPU-embedding-layer tutorial: float ids, one layer, a Ranking task."""

  def __init__(self, make_embedding, lookups, **unused):
    super().__init__(lookups)
    self.embedding_layer = make_embedding(
      {
        "user_number": E.FeatureConfig(table(len(USERS) + 1, 4, "user")),
        "movie_number": E.FeatureConfig(table(len(MOVIES) + 1, 4, "movie")),
      }
    )
    self.ratings = _score_head()
    self.task = _mse_task()

  def loss_of(self, f, training):
    emb = self.embedding_layer(
      {"user_number": f["user_number"], "movie_number": f["movie_number"]}
    )
    pred = self.ratings(tf.concat([emb["user_number"], emb["movie_number"]], 1))
    return self.task(labels=f["rating"], predictions=pred)


def _tower(make_embedding, vocab_size: int, dim: int, name: str):
  """`Sequential([lookup, Embedding])` of the tutorials: here the lookup
  runs in `ids` and the tower is the embedding layer on one feature."""
  return make_embedding(E.FeatureConfig(table(vocab_size + 1, dim, name)))


class BasicRanking(_Base):
  def __init__(self, make_embedding, lookups, **unused):
    super().__init__(lookups)
    self.user_embeddings = _tower(make_embedding, len(USERS), 4, "users")
    self.movie_embeddings = _tower(make_embedding, len(MOVIES), 4, "movies")
    self.ratings = _score_head()
    self.task = _mse_task()

  def loss_of(self, f, training):
    pred = self.ratings(
      tf.concat(
        [
          self.user_embeddings(f["user_id"]),
          self.movie_embeddings(f["movie_title"]),
        ],
        1,
      )
    )
    return self.task(labels=f["rating"], predictions=pred)


class BasicRetrieval(_Base):
  def __init__(self, make_embedding, lookups, candidates=None, **unused):
    super().__init__(lookups)
    self.user_model = _tower(make_embedding, len(USERS), 4, "users")
    self.movie_model = _tower(make_embedding, len(MOVIES), 4, "movies")
    metrics = None
    if candidates is not None:
      metrics = tfrs.metrics.FactorizedTopK(
        candidates=candidates.map(self.movie_model), ks=(1, 5)
      )
    self.task = tfrs.tasks.Retrieval(metrics=metrics)

  def loss_of(self, f, training):
    return self.task(
      self.user_model(f["user_id"]),
      self.movie_model(f["movie_title"]),
      compute_metrics=not training,
    )


class Dcn(_Base):
  def __init__(self, make_embedding, lookups, **unused):
    super().__init__(lookups)
    self.embedding = make_embedding(
      {
        "user_id": E.FeatureConfig(table(len(USERS) + 1, 4, "users")),
        "movie_title": E.FeatureConfig(table(len(MOVIES) + 1, 4, "movies")),
        "gender": E.FeatureConfig(table(2, 4, "gender")),
        "age_bucket": E.FeatureConfig(table(7, 4, "age")),
      }
    )
    self.cross = tfrs.layers.dcn.Cross()
    self.deep = keras.layers.Dense(8, activation="relu")
    self.logit = keras.layers.Dense(1)
    self.task = _mse_task()

  def loss_of(self, f, training):
    ids = {k: f[k] for k in ("user_id", "movie_title", "gender", "age_bucket")}
    x = tf.concat(tf.nest.flatten(self.embedding(ids)), 1)
    pred = self.logit(self.deep(self.cross(x)))
    return self.task(labels=f["rating"], predictions=pred)


class Multitask(_Base):
  def __init__(self, make_embedding, lookups, **unused):
    super().__init__(lookups)
    self.user_model = _tower(make_embedding, len(USERS), 4, "users")
    self.movie_model = _tower(make_embedding, len(MOVIES), 4, "movies")
    self.rating_model = _score_head()
    self.rating_task = _mse_task()
    self.retrieval_task = tfrs.tasks.Retrieval()

  def loss_of(self, f, training):
    users = self.user_model(f["user_id"])
    movies = self.movie_model(f["movie_title"])
    pred = self.rating_model(tf.concat([users, movies], 1))
    rating_loss = self.rating_task(labels=f["rating"], predictions=pred)
    retrieval_loss = self.retrieval_task(users, movies)
    return 1.0 * rating_loss + 0.5 * retrieval_loss


class Listwise(_Base):
  """Lists of movies per user, their movie ids a sequence feature."""

  def __init__(self, make_embedding, lookups, **unused):
    super().__init__(lookups)
    self.embedding = make_embedding(
      {
        "user_id": E.FeatureConfig(table(len(USERS) + 1, 4, "users")),
        "movie_list": E.FeatureConfig(
          table(len(MOVIES) + 1, 4, "movies"), max_sequence_length=LIST
        ),
      }
    )
    self.score = _score_head()
    self.task = _mse_task()

  def loss_of(self, f, training):
    emb = self.embedding(
      {"user_id": f["user_id"], "movie_list": f["movie_list"]}
    )
    users = tf.repeat(emb["user_id"][:, None, :], LIST, axis=1)
    scores = tf.squeeze(
      self.score(tf.concat([users, emb["movie_list"]], 2)), -1
    )
    return self.task(labels=f["rating_list"], predictions=scores)


class Featurization(_Base):
  """StringLookup and TextVectorization ids into the layer, with a
  normalized number beside them (the featurization tutorial)."""

  def __init__(self, make_embedding, lookups, timestamps, **unused):
    super().__init__(lookups)
    self.embedding = make_embedding(
      {
        "user_id": E.FeatureConfig(table(len(USERS) + 1, 4, "users")),
        "title_words": E.FeatureConfig(table(len(WORDS) + 2, 4, "words")),
      }
    )
    self.normalize = keras.layers.Normalization(axis=None)
    self.normalize.adapt(timestamps)
    self.score = keras.layers.Dense(1)
    self.task = _mse_task()

  def loss_of(self, f, training):
    emb = self.embedding(
      {"user_id": f["user_id"], "title_words": f["title_words"]}
    )
    x = tf.concat(
      [
        emb["user_id"],
        emb["title_words"],
        self.normalize(f["timestamp"])[:, None],
      ],
      1,
    )
    return self.task(labels=f["rating"], predictions=self.score(x))


PATTERNS = {
  "tpu_embedding_layer": Pattern(
    "tpu_embedding_layer",
    TpuTutorial,
    {},  # float ids as they are, as the tutorial's tf.strings.to_number
  ),
  "basic_ranking": Pattern(
    "basic_ranking",
    BasicRanking,
    {
      "user_id": string_lookup(USERS),
      "movie_title": string_lookup(MOVIES),
    },
  ),
  "basic_retrieval": Pattern(
    "basic_retrieval",
    BasicRetrieval,
    {
      "user_id": string_lookup(USERS),
      "movie_title": string_lookup(MOVIES),
    },
    retrieval=True,
  ),
  "dcn": Pattern(
    "dcn",
    Dcn,
    {
      "user_id": string_lookup(USERS),
      "movie_title": string_lookup(MOVIES),
    },
  ),
  "multitask": Pattern(
    "multitask",
    Multitask,
    {
      "user_id": string_lookup(USERS),
      "movie_title": string_lookup(MOVIES),
    },
    retrieval=True,
  ),
  "listwise": Pattern(
    "listwise",
    Listwise,
    {
      "user_id": string_lookup(USERS),
      "movie_list": string_lookup(MOVIES),
    },
  ),
  "featurization": Pattern(
    "featurization",
    Featurization,
    {"user_id": string_lookup(USERS), "title_words": words_lookup},
  ),
}
