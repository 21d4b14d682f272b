"""Implicit ALS (iALS) as a retrieval model whose tables the backend holds.

The user table is the query tower, the item table the candidate tower
(score = p_u . q_i), so evaluation, the corpus index and export are a
retrieval model's. Training is alternating least squares expressed as the
table update every backend already does exactly: with the tables'
embedding optimizer plain SGD at learning rate 1, the loss

  0.5 * sum over the batch's rows r of |e_r - stop_gradient(solve_r)|^2

has gradient e_r - solve_r at row r's activation, so the update sets each
row to its solved value (`ials_solve`). A half opens with Gramian batches
(`recsys.data.ials_batches`): each replica's holds its share of the other
side's rows, whose Gramian it sums; an all-reduce of (D + 1) D floats on
those steps only (an all-reduce ends with the same sums on every replica)
adds the replicas' sums into a non-trainable variable, checkpointed with
the model, so a resume in the middle of a half solves with the same
Gramian.
The solve batches hold DISTINCT rows of one side with their histories, and
read that variable: no replica reads more of the other table than its
share and the histories. A row whose history is longer than a batch holds
is solved over steps of its own, its chunks' sums added up the same way
into two more variables (checkpointed too). Everything a batch
looks up on the other side gets a zero gradient, so SGD leaves it as it
is. Row-sharded or replicated tables, any number of replicas (ALX's
scheme: Mehta et al., 2021).
"""

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import tensorflow as tf

from recsys import _tf_internal, ranges
from recsys.data import ials_batches as names
from recsys.feature_spec import FeatureSpec
from recsys.models.errors import EmbeddingDimError, ModelConfigError
from recsys.models.loss_inputs import LossInputs
from recsys.models.retrieval import ials_solve
from recsys.models.retrieval.model import (
  DEFAULT_KS,
  RetrievalModel,
  require_features,
)

_NUM_KINDS = names.NUM_KINDS
#: The embedding optimizer whose update sets a row to its solution.
REQUIRED_LEARNING_RATE = 1.0
#: What a TPU SGD keeps of its clipping settings (`clipvalue` becomes the
#: gradient's bounds), None when unset: set, at 0.0 too, it clips every
#: solved row.
_CLIPS = (
  "clip_weight_min",
  "clip_weight_max",
  "clip_gradient_min",
  "clip_gradient_max",
)


def _described(optimizer: Any) -> str:
  """`SGD(learning_rate=1.0, clip_weight_min=0.0)`: the class and the
  settings of an embedding optimizer that are set."""
  if optimizer is None:
    return "None"
  names = ("learning_rate", *_CLIPS, "weight_decay_factor")
  shown = ", ".join(
    f"{n}={getattr(optimizer, n)!r}"
    for n in names
    if getattr(optimizer, n, None) is not None
  )
  return f"{type(optimizer).__name__}({shown})"


def check_embedding_optimizer(
  feature_config: Mapping[str, Any], default_optimizer: Any = None
) -> None:
  """Refuses tables whose optimizer is not plain SGD at learning rate 1.

  Args:
    feature_config: feature name -> `FeatureConfig`.
    default_optimizer: the optimizer of tables without their own (the
      backend's default, `train.embedding_optimizer`).

  Raises:
    ModelConfigError: naming the table and its optimizer.
  """
  sgd = tf.tpu.experimental.embedding.SGD
  for name, feature in feature_config.items():
    table = feature.table
    opt = table.optimizer or default_optimizer
    rate: Any = getattr(opt, "learning_rate", None)
    plain = (
      isinstance(opt, sgd)
      and not callable(rate)  # a schedule
      and float(rate) == REQUIRED_LEARNING_RATE
      and all(getattr(opt, clip, None) is None for clip in _CLIPS)
      and not getattr(opt, "weight_decay_factor", None)  # 0: no decay
    )
    if not plain:
      raise ModelConfigError(
        f"ImplicitALS: table {table.name!r} (feature {name!r}) has "
        f"embedding optimizer {_described(opt)}; iALS sets each row to its "
        "solution "
        "through plain SGD at learning rate 1.0: set "
        "train.embedding_optimizer = @embedding.SGD() with "
        "embedding.SGD.learning_rate = 1.0, no weight decay and no "
        "clip_weight_min, clip_weight_max or clipvalue (not even 0.0)."
      )


@gin.register
class ImplicitALS(RetrievalModel):
  """iALS: user and item tables trained by exact alternating solves.

  Example:
    >>> specs = ials_batches.feature_specs(pairs, 944, 1683)
    >>> model = ImplicitALS(specs, ["user"], ["item"], dim=32, reg=100.0,
    ...                     alpha=10.0)
  """

  @ranges.checked
  def __init__(
    self,
    feature_specs: Sequence[FeatureSpec],
    query_features: ranges.Names = (names.USER,),
    candidate_features: ranges.Names = (names.ITEM,),
    candidate_id_feature: ranges.Name | None = None,
    num_dense: ranges.NonNegativeInt = 0,
    dim: ranges.PositiveInt = 32,
    reg: ranges.Positive = 100.0,
    alpha: ranges.NonNegative = 10.0,
    unobserved_weight: ranges.Positive = 1.0,
    reg_exponent: ranges.NonNegative = 0.0,
    ks: ranges.Cutoffs = DEFAULT_KS,
    name: ranges.Name | None = "implicit_als",
  ) -> None:
    """Checks the settings and the iALS features of `feature_specs`.

    Args:
      feature_specs: the source's specs, with the six features of
        `recsys.data.ials_batches.feature_specs`.
      query_features: the user id feature (one).
      candidate_features: the item id feature (one).
      candidate_id_feature: the item id feature (default: the first).
      num_dense: must be 0 (iALS has no dense input).
      dim: the tables' width D (`EmbeddingSettings.dim`).
      reg: L2 regularization lambda (> 0).
      alpha: extra weight of an observed pair (>= 0).
      unobserved_weight: w0, the weight of every unobserved pair (> 0).
      reg_exponent: frequency scaling nu of Rendle et al. (2022): lambda_u
        = reg * (alpha |I_u| + w0 |I|)^nu; 0 is plain `reg`.
      ks: cut-offs of the corpus hit rates.
      name: Keras name.

    Raises:
      SettingRangeError: a setting outside its declared range.
      ModelConfigError: dense features, or a missing iALS feature.
    """
    if len(query_features) != 1 or len(candidate_features) != 1:
      raise ModelConfigError(
        f"ImplicitALS: one user id query feature and one item id candidate "
        f"feature, got {list(query_features)} and {list(candidate_features)}."
      )
    super().__init__(
      feature_specs,
      query_features,
      candidate_features,
      candidate_id_feature,
      embedding_dim=dim,
      num_dense=num_dense,
      ks=ks,
      name=name,
    )
    if num_dense:
      raise ModelConfigError(
        f"ImplicitALS: num_dense must be 0 (no dense input), got {num_dense}."
      )
    by_name = {s.name: s for s in self.feature_specs}
    needed = (
      names.USER_HISTORY,
      names.ITEM_HISTORY,
    )
    require_features(
      "ImplicitALS",
      "the iALS features",
      needed,
      by_name,
      " Take feature_specs from `recsys.data.ials_batches.feature_specs`.",
    )
    self._user = self.query_features[0]
    self._item = self.candidate_id_feature
    self._num_users = by_name[self._user].vocabulary_size
    self._num_items = by_name[self._item].vocabulary_size
    self._reg, self._alpha = float(reg), float(alpha)
    self._w0, self._nu = float(unobserved_weight), float(reg_exponent)
    # The tables' Gramians, the same on every replica (each assigns the
    # value it computed alike): synchronized on read, saved once.
    self.item_gramian, self.user_gramian = (
      self.add_weight(
        name=f"{which}_gramian",
        shape=[dim, dim],
        initializer="zeros",
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
      )
      for which in ("item", "user")
    )
    # A long history's sums so far (`ials_batches.USER_LONG`), added over
    # the replicas and steps of its row: Q_u^T Q_u and the sum of q_i.
    self.long_observed, self.long_summed = (
      self.add_weight(
        name=f"long_history_{which}",
        shape=shape,
        initializer="zeros",
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
      )
      for which, shape in (("observed", [dim, dim]), ("summed", [dim]))
    )

  def check_tables(
    self, feature_config: Mapping[str, Any], default_optimizer: Any = None
  ) -> None:
    """What a run checks before training: `check_embedding_optimizer`."""
    check_embedding_optimizer(feature_config, default_optimizer)

  @tf.autograph.experimental.do_not_convert
  def _row(self, activations: Mapping[str, tf.Tensor], name: str) -> tf.Tensor:
    row = activations[name]
    if row.shape[-1] is not None and row.shape[-1] != self.embedding_dim:
      raise EmbeddingDimError(
        f"ImplicitALS: feature {name!r} has width {row.shape[-1]} but the "
        f"model's dim is {self.embedding_dim}; set ImplicitALS.dim to "
        "EmbeddingSettings.dim."
      )
    return row

  def query_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """The user rows `[B, D]`."""
    del features, training
    return self._row(activations, self._user)

  def candidate_embeddings(
    self,
    activations: Mapping[str, tf.Tensor],
    features: Mapping[str, tf.Tensor] | None = None,
    training: bool = False,
  ) -> tf.Tensor:
    """The item rows `[B, D]`."""
    del features, training
    return self._row(activations, self._item)

  @tf.autograph.experimental.do_not_convert
  def _solved(
    self,
    features: Mapping[str, Any],
    activations: Mapping[str, tf.Tensor],
    history: str,
    gramian: tf.Variable,
    corpus_size: int,
  ) -> tf.Tensor:
    regularization = ials_solve.row_regularization(
      tf.reshape(features[names.COUNTS], [-1]),
      self._reg,
      self._alpha,
      self._w0,
      self._nu,
      corpus_size,
    )
    return ials_solve.solve_rows(
      tf.cast(gramian, activations[history].dtype),
      activations[history],
      regularization,
      self._alpha,
      self._w0,
      tf.reshape(features[names.SEGMENT], [-1]),
    )

  @tf.autograph.experimental.do_not_convert
  def _add_to_sums(
    self, side: tf.Tensor, activations: Mapping[str, tf.Tensor]
  ) -> tuple[tf.Tensor, tf.Tensor]:
    """Adds this step's batches to the sums that span batches: on a
    Gramian batch (`ials_side` `ITEM_GRAMIAN` / `USER_GRAMIAN`, + `RESTART`
    on a half's first step) the Gramian of the rows its history feature
    holds, on a long-history batch (`USER_LONG` / `ITEM_LONG`, + `RESTART`
    on its row's first step) its chunks' Q^T Q and sum of q; each summed
    over the replicas into its variable.

    Only those steps (a half's first few, and a long row's) all-reduce
    their (D + 1) D floats; every step all-reduces the count of each kind
    of batch its replicas hold (`_step_kind`), so the replicas agree on
    whether to. A step whose replicas hold different kinds of batch is
    refused (`ImplicitALSData.steps_multiple`).

    Returns:
      The long history's sums after this step (Q^T Q `[D, D]`, sum `[D]`).
    """
    own = side[0]  # a batch is all of one kind
    kind = self._step_kind(own)
    dim = self.embedding_dim

    def of(code: int, kind: tf.Tensor = kind) -> tf.Tensor:
      return tf.logical_or(
        tf.equal(kind, code), tf.equal(kind, code + names.RESTART)
      )

    # What each kind of batch adds, from the history feature carrying its
    # rows: [Q^T Q; 0] to a Gramian, [Q^T Q; sum of q] to a long row.
    adders = (
      (names.ITEM_GRAMIAN, names.USER_HISTORY, _gramian_only),
      (names.USER_GRAMIAN, names.ITEM_HISTORY, _gramian_only),
      (names.USER_LONG, names.USER_HISTORY, _observed_and_summed),
      (names.ITEM_LONG, names.ITEM_HISTORY, _observed_and_summed),
    )
    spec = tf.TensorSpec([dim + 1, dim], tf.float32)

    def partial() -> tf.Tensor:  # this replica's part (padding: zeros)
      branches = [
        (
          of(code, own),
          lambda f=add, h=history: tf.cast(f(activations[h]), tf.float32),
        )
        for code, history, add in adders
      ]
      return tf.case(branches, default=lambda: tf.zeros(spec.shape, spec.dtype))

    adds = {code: of(code) for code, _, _ in adders}
    summed = _tf_internal.summed_when(
      tf.distribute.get_replica_context(),
      tf.reduce_any(tf.stack(list(adds.values()))),
      partial,
      spec,
    )
    for code, variable in (
      (names.ITEM_GRAMIAN, self.item_gramian),
      (names.USER_GRAMIAN, self.user_gramian),
    ):
      restart = tf.equal(kind, code + names.RESTART)
      _accumulate(variable, summed[:dim], restart, adds[code])
    restart = tf.logical_or(
      tf.equal(kind, names.USER_LONG + names.RESTART),
      tf.equal(kind, names.ITEM_LONG + names.RESTART),
    )
    long = tf.logical_or(adds[names.USER_LONG], adds[names.ITEM_LONG])
    return (
      _accumulate(self.long_observed, summed[:dim], restart, long),
      _accumulate(self.long_summed, summed[dim], restart, long),
    )

  @staticmethod
  def _step_kind(kind: tf.Tensor) -> tf.Tensor:
    """The kind of batch of this step (`ials_side`): the one its replicas
    hold besides all-padding batches (which end a half's solves and go
    with any), from one all-reduce of NUM_KINDS floats; `kind` itself on
    one replica.

    Raises (when the step runs):
      InvalidArgumentError: the replicas hold different kinds of batch.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
      return kind
    counts = context.all_reduce(
      tf.distribute.ReduceOp.SUM,
      tf.one_hot(kind - names.PADDING, _NUM_KINDS, dtype=tf.float32),
    )
    held = counts[1:] > 0  # not padding
    check = tf.debugging.assert_less_equal(
      tf.math.count_nonzero(held),
      tf.constant(1, tf.int64),
      message=(
        "ImplicitALS: the replicas of one step hold different kinds of "
        "iALS batch (Gramian, user or item solves); feed each half in "
        "whole steps: set ImplicitALSData.steps_multiple to the number "
        "of replicas"
      ),
    )
    with tf.control_dependencies([check]):
      found = tf.cast(tf.argmax(tf.cast(held, tf.int32)), kind.dtype)
      return tf.where(
        tf.reduce_any(held), found + names.PADDING + 1, names.PADDING
      )

  #: The training step sums the rows' losses: the gradient at row r is
  #: e_r - solve_r exactly (evaluation sums and counts its examples itself).
  SUMMED_LOSS = True

  def per_example_loss(self, batch: LossInputs) -> tf.Tensor:
    """Training: each row's half-step loss of the module docstring `[B]`
    (the step sums them: `SUMMED_LOSS`). Evaluation:
    `RetrievalModel.per_example_loss` (in-batch softmax loss, corpus hit
    rates)."""
    if not batch.training:
      return super().per_example_loss(batch)
    activations, features = batch.activations, batch.features
    missing = [
      key
      for key in (names.SIDE, names.COUNTS, names.SEGMENT)
      if key not in (features or {})
    ]
    if features is None or missing:
      raise ModelConfigError(
        f"ImplicitALS: a training batch needs features {missing} (which "
        "side each row solves, its history's length, its first entry: "
        "`recsys.data.ials_batches`)."
      )
    side = tf.reshape(features[names.SIDE], [-1])
    long_observed, long_summed = self._add_to_sums(side, activations)
    counts = tf.reshape(features[names.COUNTS], [-1])
    # A row cut into chunks is updated once, through its first entry: the
    # backend sums the gradients of a row's entries. A long row: through
    # the entry carrying it (its count), in its last step.
    segment = tf.reshape(features[names.SEGMENT], [-1])
    first = tf.equal(segment, tf.range(tf.size(segment), dtype=segment.dtype))
    per_row = None
    for codes, row, history, gramian, size in (
      (
        names.SOLVES_USERS,
        self._user,
        names.USER_HISTORY,
        self.item_gramian,
        self._num_items,
      ),
      (
        names.SOLVES_ITEMS,
        self._item,
        names.ITEM_HISTORY,
        self.user_gramian,
        self._num_users,
      ),
    ):
      dtype = activations[row].dtype
      short, *longs = codes
      weight = tf.cast(tf.logical_and(tf.equal(side, short), first), dtype)
      is_long = tf.logical_and(
        tf.reduce_any(side[:, tf.newaxis] == tf.constant(longs, side.dtype), 1),
        counts > 0,
      )
      long_weight = tf.cast(is_long, dtype)
      # A batch solves one side: the other's systems are skipped, not solved.
      solved = tf.cond(
        tf.reduce_any(weight > 0),
        functools.partial(
          self._solved, features, activations, history, gramian, size
        ),
        functools.partial(tf.zeros_like, activations[row]),
      )
      solved_long = tf.cond(
        tf.reduce_any(is_long),
        functools.partial(
          self._solved_long,
          tf.reduce_max(counts),
          long_observed,
          long_summed,
          gramian,
          size,
          dtype,
        ),
        lambda dtype=dtype: tf.zeros([1, self.embedding_dim], dtype),
      )
      solved = tf.stop_gradient(
        tf.where(is_long[:, tf.newaxis], solved_long, solved)
      )
      error = tf.reduce_sum(tf.square(activations[row] - solved), axis=-1)
      loss = 0.5 * (weight + long_weight) * error
      per_row = loss if per_row is None else per_row + loss
    return per_row

  @tf.autograph.experimental.do_not_convert
  def _solved_long(
    self,
    count: tf.Tensor,
    observed: tf.Tensor,
    summed: tf.Tensor,
    gramian: tf.Variable,
    corpus_size: int,
    dtype: tf.DType,
  ) -> tf.Tensor:
    """The long row's solution `[1, D]` from its sums over its steps."""
    regularization = ials_solve.row_regularization(
      tf.reshape(count, [1]),
      self._reg,
      self._alpha,
      self._w0,
      self._nu,
      corpus_size,
    )
    return ials_solve.solve_systems(
      tf.cast(gramian, dtype),
      tf.cast(observed, dtype)[tf.newaxis],
      tf.cast(summed, dtype)[tf.newaxis],
      tf.cast(regularization, dtype),
      self._alpha,
      self._w0,
    )


@tf.autograph.experimental.do_not_convert
def _accumulate(
  variable: tf.Variable, summed: tf.Tensor, restart: tf.Tensor, adds: tf.Tensor
) -> tf.Tensor:
  """Sets `variable` to `summed` on a restart, adds it where `adds`,
  leaves it as it is otherwise; returns the value it now holds."""
  value = tf.where(restart, summed, tf.where(adds, variable + summed, variable))
  variable.assign(value)
  return value


@tf.autograph.experimental.do_not_convert
def _gramian_only(rows: tf.Tensor) -> tf.Tensor:
  """`[D + 1, D]`: the Gramian of every row `[..., D]` over a row of zeros."""
  flat = tf.reshape(rows, [-1, tf.shape(rows)[-1]])
  return tf.concat([ials_solve.gramian(flat), tf.zeros_like(flat[:1])], 0)


@tf.autograph.experimental.do_not_convert
def _observed_and_summed(rows: tf.Tensor) -> tf.Tensor:
  """`[D + 1, D]`: the Gramian of every row `[..., D]` over the sum of
  them (zero padding rows add nothing to either)."""
  flat = tf.reshape(rows, [-1, tf.shape(rows)[-1]])
  return tf.concat(
    [ials_solve.gramian(flat), tf.reduce_sum(flat, 0, keepdims=True)], 0
  )
