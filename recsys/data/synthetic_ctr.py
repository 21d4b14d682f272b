"""Synthetic Criteo-like clicks from a planted model whose optimum is known.

Every example has `num_dense` dense features (log(1 + count), like the Criteo
reader delivers) and one categorical feature per vocabulary size, with
Zipf-skewed ids and optional weighted multi-hot bags. The click label is
Bernoulli(sigmoid(logit)) with a planted DLRM-shaped logit:

    logit = bias + scale * (  a_dense * w . x~
                            + a_first * sum_f u_f(bag_f)
                            + a_pair  * sum_{a<b} <e_a, e_b> / sqrt(k) )

where `x~` are the standardised dense features, `u_f(id)` and `v_f(id)` (k
dims) are hidden per-id factors, a bag's factor is the weighted mean over its
ids (TF's `mean` combiner), `e_0 = P x~` is a dense "embedding" and
`e_f = v_f(bag_f)`. Each of the three parts is normalised to unit standard
deviation, `scale` sets the logit's standard deviation (`logit_std`) and
`bias` the mean click rate (`ctr`). A DLRM (dot interactions of embeddings
plus MLPs) can represent this model exactly.

Because the true probability of every example is known, the source reports
the Bayes-optimal AUC and log-loss (`bayes_auc`, `bayes_logloss`), computed
from the probabilities of a large held-out sample (`recsys.data.oracle`).

Example i is a pure function of `(seed, split, i)` (`recsys.data._random`):
batches are generated in parallel by TF ops, are identical for any batch
size or sharding, and input pipeline p of P generates batches p, p+P, ...

Drift (opt-in, `drift_every`): a drifting feature draws the ids of the
example at stream position t from a window of its id space that moves by
one id every `drift_every` positions (`recsys.data.drift`): one new id
appears and one old id stops every `drift_every` examples, and over the
stream the ids far outnumber the window (`vocab_sizes`, then the capacity a
dynamic table should have). Such a feature delivers RAW ids (large int64
values, `FeatureSpec.raw_ids`), and its hidden factors are hashed from the
raw id, so the planted model and its optimum stay known without a table of
every id. Training example i is at position i (a sized stream repeats from
its start); evaluation example j at position `num_examples -
num_eval_examples + j`: a fresh sample (its own random stream) of the last
positions the training stream reached, so evaluation asks for the ids that
are current at the end of training, those a table should hold then. (A
continuation past the end would ask for `num_eval_examples / drift_every`
ids no training example showed: cold start, not what the table kept.) The
oracle's sample is spread evenly over the same positions.
"""

import functools
import math
from collections.abc import Sequence
from typing import Annotated

import gin
import numpy as np
import tensorflow as tf

from recsys import ranges
from recsys.data import _random, drift, oracle
from recsys.data.pipeline import Batch, IndexedSource
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec

_CALIBRATION_EXAMPLES = 1 << 15
#: Vocabulary and bag sizes: one positive integer per feature.
_SIZES = ranges.Each(ranges.Int(1), min_len=1)
#: Positions per one-id move of a drifting feature's window.
_DRIFT = ranges.Int(0, note="0: no drift")
# Examples per eager pass of the calibration and the oracle: TF keeps
# buffers sized by the largest batch it ran (issue 19: 65,536 at once left
# ~80 MB resident; 8,192 leaves almost none). Values do not depend on it.
_CHUNK = 1 << 13


class SyntheticConfigError(SettingsError):
  """Inconsistent synthetic-data settings."""


def _per_feature(value, n: int, name: str, kind):
  """Broadcasts a scalar setting to n features or checks a sequence's length."""
  if isinstance(value, (bool, int, float)):
    return [kind(value)] * n
  value = list(value)
  if len(value) != n:
    raise SyntheticConfigError(
      f"{name} has {len(value)} entries but vocab_sizes has {n}; give one per "
      "categorical feature, or a single value for all."
    )
  return [kind(v) for v in value]


@gin.register
class SyntheticCTR(IndexedSource):
  """Criteo-shaped synthetic click data with a planted, known-optimum model.

  Example:
    >>> source = SyntheticCTR(num_dense=13, vocab_sizes=(100, 1000),
    ...                       multi_hot_sizes=(1, 4), num_examples=10_000)
    >>> features, labels = next(iter(source.dataset(256)))
    >>> features["dense"].shape, features["categorical"]["C2"].shape
    (TensorShape([256, 13]), TensorShape([256, None]))
    >>> source.bayes_auc   # the best AUC any model can reach on this data

  Attributes:
    feature_specs: one `FeatureSpec` per categorical feature, named C1, C2, ...
      (`raw_ids` for the drifting ones).
    num_dense: width of `features["dense"]`.
    drift_every: per feature, positions per one-id move of its window (0:
      no drift).
    eval_start: the stream position of evaluation example 0 (drift:
      `num_examples - num_eval_examples`; 0 without drift, where positions
      mean nothing).
  """

  config_error = SyntheticConfigError

  @ranges.checked
  def __init__(
    self,
    num_dense: ranges.NonNegativeInt = 13,
    vocab_sizes: Annotated[Sequence[int], _SIZES] = (
      1000,
      200,
      5000,
      10000,
      100,
      3000,
      800,
      2000,
    ),
    multi_hot_sizes: Annotated[
      int | Sequence[int], ranges.AnyOf((ranges.Int(1), _SIZES))
    ] = (1, 1, 1, 1, 1, 1, 3, 5),
    weighted: Annotated[
      bool | Sequence[bool],
      ranges.AnyOf((ranges.Bool(), ranges.Each(ranges.Bool(), min_len=1))),
    ] = False,
    zipf_exponent: ranges.NonNegative = 1.05,
    num_examples: ranges.PositiveInt | None = None,
    num_eval_examples: ranges.PositiveInt = 1 << 16,
    factor_dim: ranges.PositiveInt = 4,
    logit_std: ranges.NonNegative = 1.5,
    ctr: Annotated[float, ranges.Real(0, 1, lo_open=True, hi_open=True)] = 0.25,
    dense_weight: ranges.NonNegative = 0.5,
    first_order_weight: ranges.NonNegative = 1.0,
    interaction_weight: ranges.NonNegative = 1.0,
    oracle_examples: ranges.PositiveInt = 1 << 17,
    max_factor_table_size: ranges.NonNegativeInt = 1 << 21,
    seed: ranges.Seed = 0,
    name_prefix: Annotated[str, ranges.Text(empty=True)] = "C",
    drift_every: Annotated[
      int | Sequence[int],
      ranges.AnyOf((_DRIFT, ranges.Each(_DRIFT, min_len=1))),
    ] = 0,
  ):
    """Plants the model and calibrates its scale and bias.

    Args:
      num_dense: number of dense features (0 for none).
      vocab_sizes: vocabulary size of each categorical feature.
      multi_hot_sizes: the largest bag of each feature (1 = one-hot ids `[B]`;
        > 1 = RaggedTensor `[B, None]` with 1..size ids per row).
      weighted: per feature (or all): deliver weights in [0.5, 1.5) in
        `features["weights"]`; the planted model takes the weighted mean.
      zipf_exponent: skew of id frequencies (0 = uniform).
      num_examples: training examples (None: infinite).
      num_eval_examples: examples in the evaluation split.
      factor_dim: k, the dimension of the hidden interaction factors.
      logit_std: standard deviation of the planted logit (sets how
        predictable clicks are: 1.5 gives a Bayes AUC near 0.82).
      ctr: mean click rate.
      dense_weight, first_order_weight, interaction_weight: relative size of
        the three parts of the logit.
      oracle_examples: sample size for `bayes_auc` / `bayes_logloss`.
      max_factor_table_size: precompute the hidden factors as a table of
        `sum(vocab_sizes) * (factor_dim + 1)` floats when at most this size
        (faster); larger vocabularies hash them per id (same values). Not
        with drift: every factor is then hashed (from the raw id).
      seed: everything (model and data) is a function of the seed.
      name_prefix: features are called f"{name_prefix}{i}", i = 1, 2, ...
      drift_every: per feature (or all): 0 = no drift; d > 0 = the
        feature's ids come from a window of `vocab_sizes[f]` ids that moves
        by one id every d examples (one new id per d examples, Zipf-skewed
        as without drift), delivered as raw int64 ids (module docstring).
        Needs a sized stream, `num_examples >= num_eval_examples`: the
        evaluation split samples its last `num_eval_examples` positions.

    Raises:
      SyntheticConfigError: inconsistent sizes or out-of-range settings.
    """
    vocab_sizes = [int(v) for v in vocab_sizes]
    n = len(vocab_sizes)
    if n == 0:
      raise SyntheticConfigError(
        "vocab_sizes is empty: give at least one categorical feature."
      )
    if min(vocab_sizes) < 1:
      raise SyntheticConfigError(
        f"vocab_sizes must all be >= 1, got {vocab_sizes}."
      )
    if num_dense < 0:
      raise SyntheticConfigError(f"num_dense must be >= 0, got {num_dense}.")
    if not 0.0 < ctr < 1.0:
      raise SyntheticConfigError(f"ctr must be in (0, 1), got {ctr}.")
    if num_examples is not None and num_examples < 1:
      raise SyntheticConfigError(
        f"num_examples must be None or >= 1, got {num_examples}."
      )
    self.num_dense = int(num_dense)
    self.vocab_sizes = vocab_sizes
    self.multi_hot_sizes = _per_feature(
      multi_hot_sizes, n, "multi_hot_sizes", int
    )
    if min(self.multi_hot_sizes) < 1:
      raise SyntheticConfigError(
        f"multi_hot_sizes must be >= 1, got {self.multi_hot_sizes}."
      )
    self.weighted = _per_feature(weighted, n, "weighted", bool)
    self.zipf_exponent = float(zipf_exponent)
    self.num_examples = num_examples
    self.num_eval_examples = int(num_eval_examples)
    self.factor_dim = int(factor_dim)
    self.ctr = float(ctr)
    self.seed = int(seed)
    self.oracle_examples = int(oracle_examples)
    self.names = [f"{name_prefix}{i + 1}" for i in range(n)]
    self.drift_every = _per_feature(drift_every, n, "drift_every", int)
    self.eval_start = self._check_drift()
    self.feature_specs = [
      FeatureSpec(
        name=name,
        vocabulary_size=v,
        multi_hot=m > 1,
        max_ids=m,
        weighted=w,
        raw_ids=d > 0,
      )
      for name, v, m, w, d in zip(
        self.names,
        vocab_sizes,
        self.multi_hot_sizes,
        self.weighted,
        self.drift_every,
      )
    ]

    key = functools.partial(_random.make_key, self.seed)
    k = self.factor_dim
    # Column layout of one example's uniforms: dense (1 per feature),
    # then per categorical feature its m id slots, m weight slots (weighted
    # features), 1 bag-length slot (multi-hot features), then the label.
    self._id_cols, self._w_cols, self._len_cols = [], [], []
    names: list[tuple] = [("dense", d) for d in range(num_dense)]
    for f, m in enumerate(self.multi_hot_sizes):
      self._id_cols.append(list(range(len(names), len(names) + m)))
      names += [("id", f, t) for t in range(m)]
      if self.weighted[f]:
        self._w_cols.append(list(range(len(names), len(names) + m)))
        names += [("w", f, t) for t in range(m)]
      else:
        self._w_cols.append([])
      self._len_cols.append(len(names) if m > 1 else None)
      names += [("len", f)] if m > 1 else []
    self._label_col = len(names)
    names.append(("label",))
    self._column_names = names
    self._stream_keys: dict[str, np.ndarray] = {}
    # Id permutation (rank -> id) so that popular ids are spread over the table.
    self._id_mult = [
      _random.coprime_multiplier(v, key("mult", f))
      for f, v in enumerate(vocab_sizes)
    ]
    self._id_offset = [key("offset", f) % v for f, v in enumerate(vocab_sizes)]
    # Hidden per-id factors, hashed from (feature, id): no memory for any
    # vocabulary. Row f holds feature f's keys [u, v_1 .. v_k]. Small
    # vocabularies get the same values precomputed as a table (a gather is
    # cheaper than hashing).
    self._factor_keys = np.array(
      [[key("u", f)] + [key("v", f, j) for j in range(k)] for f in range(n)],
      np.uint32,
    )
    self._table_offsets = np.cumsum([0] + vocab_sizes[:-1]).astype(np.int64)
    self._factor_table = None
    # Drifting raw ids are unbounded: their factors are always hashed.
    self._drifting = any(self.drift_every)
    if (
      not self._drifting and sum(vocab_sizes) * (k + 1) <= max_factor_table_size
    ):
      with tf.init_scope():
        self._factor_table = tf.concat(
          [
            _random.symmetric(
              self._factor_keys[f][None, :],
              tf.range(v, dtype=tf.int64)[:, None],
            )
            for f, v in enumerate(vocab_sizes)
          ],
          axis=0,
        ).numpy()  # [sum V, 1 + k]
    # Which column of the concatenated bags belongs to which feature.
    self._column_feature = np.repeat(np.arange(n), self.multi_hot_sizes)
    # Each feature's 64-bit raw-id key (`drift.raw_id`).
    self._raw_keys = np.array(
      [(key("raw", f, 0) << 32) | key("raw", f, 1) for f in range(n)],
      np.uint64,
    )
    self._group = np.eye(n, dtype=np.float32)[self._column_feature]  # [M, F]
    # Small planted parameters.
    rng = np.random.default_rng([self.seed, 7])
    self._dense_mu = rng.uniform(0.0, 3.0, num_dense).astype(np.float32)
    self._dense_sigma = rng.uniform(0.5, 1.5, num_dense).astype(np.float32)
    self._dense_w = rng.standard_normal(num_dense).astype(np.float32)
    self._dense_proj = rng.standard_normal((num_dense, k)).astype(np.float32)
    self._weights = (
      float(dense_weight) if num_dense else 0.0,
      float(first_order_weight),
      float(interaction_weight),
    )
    self._calibrate(float(logit_std))

  # ----------------------------------------------------------------- features
  #
  # Internally a batch is "padded": dense `[N, D]`, ids `[N, M]` (the bags of
  # all features side by side, M = sum of multi_hot_sizes) and weights
  # `[N, M]` (0 on padding). The planted model reads this form; the public
  # features (ragged bags) are built from it.

  def _keys(self, stream: str) -> np.ndarray:
    """The uint32 key of every column of `stream`, `[1, C]`."""
    if stream not in self._stream_keys:
      self._stream_keys[stream] = np.array(
        [
          [
            _random.make_key(self.seed, stream, *name)
            for name in self._column_names
          ]
        ],
        np.uint32,
      )
    return self._stream_keys[stream]

  def _generate(self, index: tf.Tensor, stream: str):
    """`(padded batch, label uniforms [N])` of examples `index` (int64 [N])."""
    u = _random.uniform(self._keys(stream), index[:, None])  # [N, C]
    d = self.num_dense
    dense = None
    if d:
      # Log-logistic counts (a heavy right tail, like Criteo's): z is a
      # standard logistic variable scaled to unit variance.
      z = _random.logistic(u[:, :d])
      dense = tf.math.log1p(
        tf.floor(tf.exp(self._dense_mu + self._dense_sigma * z))
      )
    sizes = self.multi_hot_sizes
    vocab = np.repeat(self.vocab_sizes, sizes)
    rank = _random.zipf_rank(
      tf.gather(u, [c for cols in self._id_cols for c in cols], axis=1),
      vocab,
      self.zipf_exponent,
    )
    ids = (
      rank * np.repeat(self._id_mult, sizes) + np.repeat(self._id_offset, sizes)
    ) % vocab
    if self._drifting:
      ids = self._drifted(ids, self._positions(index, stream))
    weights, lengths = [], []
    for f, m in enumerate(sizes):
      w = (
        (0.5 + tf.gather(u, self._w_cols[f], axis=1))
        if self.weighted[f]
        else None
      )
      if m > 1:
        length = tf.minimum(
          tf.cast(u[:, self._len_cols[f]] * m, tf.int64) + 1, m
        )
        mask = tf.sequence_mask(length, m, dtype=tf.float32)
        w = mask if w is None else w * mask
        lengths.append(length)
      else:
        lengths.append(None)
        w = tf.ones_like(u[:, :1]) if w is None else w
      weights.append(w)
    padded = {
      "dense": dense,
      "ids": ids,
      "weights": tf.concat(weights, axis=1),
      "lengths": lengths,
    }
    return padded, u[:, self._label_col]

  # -------------------------------------------------------------------- drift

  def _check_drift(self) -> int:
    """The stream position of evaluation example 0 (0 without drift).

    Raises:
      SyntheticConfigError: drift without a sized stream holding the
        evaluation positions, or an oracle sample too large to place.
    """
    if not any(self.drift_every):
      return 0
    n, e = self.num_examples, self.num_eval_examples
    if n is None or n < e:
      raise SyntheticConfigError(
        f"drift_every={self.drift_every} needs num_examples >= "
        f"num_eval_examples (got num_examples={n}, num_eval_examples={e}): "
        "the evaluation split samples the last num_eval_examples positions "
        "of the training stream, so the stream must have an end. Set "
        "SyntheticCTR.num_examples (e.g. train_steps * batch size), or a "
        "smaller num_eval_examples."
      )
    if e * self.oracle_examples >= 1 << 62:
      raise SyntheticConfigError(
        f"num_eval_examples * oracle_examples = {e * self.oracle_examples} "
        "is too large to place the oracle's sample on the evaluation "
        "positions in int64; give fewer of either."
      )
    return n - e

  def _positions(self, index: tf.Tensor, stream: str) -> tf.Tensor:
    """The stream positions (window positions) of examples `index` [N]:
    training and calibration at i, evaluation at `eval_start + i`, the
    oracle's sample spread evenly over the evaluation positions."""
    if stream == "eval":
      return index + self.eval_start
    if stream == "oracle":
      return self.eval_start + (index * self.num_eval_examples) // (
        self.oracle_examples
      )
    return index

  def _drifted(self, residue: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """The padded ids `[N, M]` with drifting features' residues replaced
    by the raw ids of their window at `position` `[N]`."""
    sizes = self.multi_hot_sizes
    every = np.repeat(np.maximum(self.drift_every, 1), sizes).astype(np.int64)
    start = position[:, None] // every  # [N, M]
    window = drift.window_ids(
      residue, start, np.repeat(self.vocab_sizes, sizes)
    )
    raw = drift.raw_id(np.repeat(self._raw_keys, sizes), window)
    drifting = np.repeat(np.asarray(self.drift_every) > 0, sizes)
    return tf.where(drifting[None, :], raw, residue)

  def window(self, name: str, position: int) -> range:
    """The window ids feature `name` draws from at stream `position`
    (`range(0, vocab_size)` for a feature without drift).

    Raises:
      KeyError: no feature `name`.
    """
    f = self._feature_index(name)
    every, size = self.drift_every[f], self.vocab_sizes[f]
    start = int(position) // every if every else 0
    return range(start, start + size)

  def delivered_ids(
    self, name: str, window_ids: Sequence[int] | np.ndarray
  ) -> np.ndarray:
    """The ids feature `name` delivers for window ids (int64 NumPy): the
    raw ids of a drifting feature, the ids themselves otherwise."""
    f = self._feature_index(name)
    window_ids = np.asarray(window_ids, np.int64)
    if not self.drift_every[f]:
      return window_ids
    with tf.init_scope():
      return drift.raw_id(self._raw_keys[f], tf.constant(window_ids)).numpy()

  def _feature_index(self, name: str) -> int:
    if name not in self.names:
      raise KeyError(
        f"SyntheticCTR has no feature {name!r}; it has {self.names}."
      )
    return self.names.index(name)

  def _public(self, padded) -> dict[str, object]:
    """The contract's features dict from a padded batch."""
    features: dict[str, object] = {}
    if self.num_dense:
      features["dense"] = padded["dense"]
    categorical, weights = {}, {}
    start = 0
    for f, name in enumerate(self.names):
      m = self.multi_hot_sizes[f]
      ids, w = (
        padded["ids"][:, start : start + m],
        padded["weights"][:, start : start + m],
      )
      start += m
      if m == 1:
        categorical[name] = ids[:, 0]
        if self.weighted[f]:
          weights[name] = w[:, 0]
        continue
      lengths = padded["lengths"][f]
      mask = tf.sequence_mask(lengths, m)
      categorical[name] = tf.RaggedTensor.from_row_lengths(
        tf.boolean_mask(ids, mask), lengths, validate=False
      )
      if self.weighted[f]:
        weights[name] = categorical[name].with_flat_values(
          tf.boolean_mask(w, mask)
        )
    features["categorical"] = categorical
    if weights:
      features["weights"] = weights
    return features

  def _padded(self, features) -> dict[str, object]:
    """A padded batch from the contract's features (any batch of the source)."""
    given = features.get("weights", {})
    ids, weights = [], []
    for f, name in enumerate(self.names):
      m = self.multi_hot_sizes[f]
      value = features["categorical"][name]
      if isinstance(value, tf.RaggedTensor):
        ids.append(tf.cast(value.to_tensor(shape=[None, m]), tf.int64))
        w = (
          given[name]
          if name in given
          else value.with_flat_values(
            tf.ones_like(value.flat_values, tf.float32)
          )
        )
        weights.append(tf.cast(w.to_tensor(shape=[None, m]), tf.float32))
      else:
        value = tf.reshape(tf.cast(value, tf.int64), [-1, 1])
        ids.append(value)
        weights.append(
          tf.ones_like(value, tf.float32)
        )  # one id: its weight cancels
    return {
      "dense": features.get("dense"),
      "ids": tf.concat(ids, axis=1),
      "weights": tf.concat(weights, axis=1),
    }

  # ------------------------------------------------------------ planted model

  def _parts(self, padded) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The three unnormalised logit parts of a padded batch, float32 `[N]`."""
    ids, w = padded["ids"], padded["weights"]  # [N, M]
    if self._factor_table is not None:
      factors = tf.gather(
        tf.constant(self._factor_table),
        ids + self._table_offsets[self._column_feature],
      )  # [N, M, 1 + k]
    else:
      factors = _random.symmetric(
        self._factor_keys[self._column_feature][None], ids[:, :, None]
      )
    group = tf.constant(self._group)  # [M, F]
    num_features, width = len(self.names), self.factor_dim + 1
    weighted = tf.reshape(
      tf.transpose(factors * w[:, :, None], [0, 2, 1]), [-1, tf.shape(ids)[1]]
    )  # [N * (1+k), M]
    sums = tf.reshape(tf.matmul(weighted, group), [-1, width, num_features])
    totals = tf.matmul(w, group)  # [N, F]
    means = (
      sums / tf.where(totals > 0, totals, tf.ones_like(totals))[:, None, :]
    )
    first = tf.reduce_sum(means[:, 0, :], axis=1)
    embeddings = tf.transpose(means[:, 1:, :], [0, 2, 1])  # [N, F, k]
    if self.num_dense:
      x = (
        tf.cast(padded["dense"], tf.float32) - self._dense_mean
      ) / self._dense_std
      dense_part = tf.linalg.matvec(x, self._dense_w)
      dense_emb = tf.matmul(x, self._dense_proj) / math.sqrt(self.num_dense)
      embeddings = tf.concat([embeddings, dense_emb[:, None, :]], axis=1)
    else:
      dense_part = tf.zeros_like(first)
    total = tf.reduce_sum(embeddings, axis=1)
    squares = tf.reduce_sum(embeddings * embeddings, axis=[1, 2])
    pairs = (
      0.5
      * (tf.reduce_sum(total * total, axis=1) - squares)
      / math.sqrt(self.factor_dim)
    )
    return dense_part, first, pairs

  def _calibrate(self, logit_std: float) -> None:
    """Sets dense standardisation, part scales, overall scale and bias."""
    with tf.init_scope():
      chunks = [
        self._generate(
          tf.range(
            start, min(start + _CHUNK, _CALIBRATION_EXAMPLES), dtype=tf.int64
          ),
          "calibration",
        )[0]
        for start in range(0, _CALIBRATION_EXAMPLES, _CHUNK)
      ]
      if self.num_dense:
        dense = np.concatenate([c["dense"].numpy() for c in chunks])
        self._dense_mean = dense.mean(axis=0).astype(np.float32)
        self._dense_std = np.maximum(dense.std(axis=0), 1e-3).astype(np.float32)
      per_chunk = [[p.numpy() for p in self._parts(c)] for c in chunks]
      parts = [np.concatenate(ps).astype(np.float64) for ps in zip(*per_chunk)]
    stds = [p.std() for p in parts]
    self._part_scale = [
      w / s if s > 1e-9 else 0.0 for w, s in zip(self._weights, stds)
    ]
    combined = np.zeros_like(parts[0])
    for c, p in zip(self._part_scale, parts):  # the order sum() added them
      combined = combined + c * p
    spread = combined.std()
    if spread < 1e-9:
      raise SyntheticConfigError(
        "the planted logit is constant: give a non-zero dense_weight, "
        "first_order_weight or interaction_weight."
      )
    self._scale = logit_std / spread
    z = self._scale * (combined - combined.mean())
    lo, hi = -30.0, 30.0
    for _ in range(100):  # mean sigmoid(bias + z) == ctr
      mid = 0.5 * (lo + hi)
      if np.mean(1.0 / (1.0 + np.exp(-(mid + z)))) < self.ctr:
        lo = mid
      else:
        hi = mid
    self._bias = 0.5 * (lo + hi) - self._scale * combined.mean()

  def _logits(self, padded) -> tf.Tensor:
    parts = self._parts(padded)
    combined = tf.add_n(
      [np.float32(c) * p for c, p in zip(self._part_scale, parts)]
    )
    return np.float32(self._bias) + np.float32(self._scale) * combined

  def planted_logits(self, features) -> tf.Tensor:
    """The true logit of each example of a batch of this source, float32 [B]."""
    return self._logits(self._padded(features))

  def probabilities(self, features) -> tf.Tensor:
    """The true click probability of each example (Bayes predictor), `[B]`."""
    return tf.sigmoid(self.planted_logits(features))

  # ------------------------------------------------------------------ batches

  def _batch(self, index: tf.Tensor, stream: str) -> Batch:
    padded, u = self._generate(index, stream)
    labels = tf.cast(u < tf.sigmoid(self._logits(padded)), tf.float32)
    return self._public(padded), labels

  def examples(self, index: tf.Tensor, training: bool = True) -> Batch:
    """`(features, labels)` of the examples at the given indices (int64 [N])."""
    return self._batch(
      tf.convert_to_tensor(index, tf.int64), "train" if training else "eval"
    )

  # ----------------------------------------------------------------- optimum

  @functools.cached_property
  def _oracle(self) -> dict[str, float]:
    with tf.init_scope():
      probs = []
      for start in range(0, self.oracle_examples, _CHUNK):
        index = tf.range(
          start, min(start + _CHUNK, self.oracle_examples), dtype=tf.int64
        )
        probs.append(
          tf.sigmoid(self._logits(self._generate(index, "oracle")[0])).numpy()
        )
    p = np.concatenate(probs).astype(np.float64)
    mean = float(p.mean())
    return {
      "auc": oracle.expected_auc(p, p),
      "logloss": oracle.expected_logloss(p, p),
      "constant_logloss": oracle.expected_logloss(np.full_like(p, mean), p),
      "ctr": mean,
    }

  @property
  def bayes_auc(self) -> float:
    """The best achievable AUC (that of the true probabilities)."""
    return self._oracle["auc"]

  @property
  def bayes_logloss(self) -> float:
    """The best achievable mean log-loss (mean binary entropy of the true p)."""
    return self._oracle["logloss"]

  @property
  def constant_logloss(self) -> float:
    """The log-loss of predicting the mean click rate for every example."""
    return self._oracle["constant_logloss"]

  def known_optimum(self, ks: tuple[int, ...] = ()) -> dict[str, float]:
    """`bayes_auc` and `bayes_logloss` (what `Trainer.train` reports)."""
    del ks
    return {"bayes_auc": self.bayes_auc, "bayes_logloss": self.bayes_logloss}

  def optimum(self) -> dict[str, float]:
    """`{auc, logloss, constant_logloss, ctr}` of the Bayes predictor."""
    return dict(self._oracle)
