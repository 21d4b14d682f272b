"""Every field of TF's embedding configuration classes, and what it does here.

A field of `tf.tpu.experimental.embedding`'s `TableConfig`, `FeatureConfig`,
`QuantizationConfig` or an optimizer that a backend accepted and ignored
would train another model than the same configuration on a TPU, silently.
So each field is listed here with what the backends do with it: honoured
as TF does on a TPU, or refused by name where a backend cannot (the check
is the backend's, `backends.base`); `tests/backends/test_tf_fields.py`
enumerates the fields of the installed TF's classes against this list, so
a field a new TF adds fails the test until it is placed here.

Example:
  >>> FIELDS["TableConfig"]["quantization_config"]
  'honoured: ...'
"""

_OPTIMIZER_COMMON = {
  "learning_rate": "honoured: a float, or a callable read once per step",
  "use_gradient_accumulation": (
    "exact: a row's gradients are always summed over the global batch "
    "before the update (False is the TPU's faster approximation; logged)"
  ),
  "clip_weight_min": "honoured: the updated rows clipped (optimizers.md)",
  "clip_weight_max": "honoured: the updated rows clipped (optimizers.md)",
  "weight_decay_factor": "honoured: TF's decay of the touched rows",
  "multiply_weight_decay_factor_by_learning_rate": "honoured",
  "clipvalue": "honoured: the gradients clipped (min, max) or +-c",
  "low_dimensional_packing_status": (
    "no effect on the numbers: how a TPU packs 1-, 2- and 4-wide tables "
    "in its memory"
  ),
}
_SLOTS = {
  "slot_variable_creation_fn": "honoured: it creates the slot variables",
}

#: Class name -> field -> what the backends do with it.
FIELDS: dict[str, dict[str, str]] = {
  "TableConfig": {
    "vocabulary_size": "honoured",
    "dim": "honoured",
    "initializer": "honoured (row by row where it has a row form: row_init)",
    "optimizer": "honoured: the table's own optimizer",
    "combiner": "honoured: sum, mean, sqrtn; a CustomCombiner is refused",
    "name": "honoured: the table's name in checkpoints and plans",
    "quantization_config": (
      "honoured: the looked-up rows clipped and rounded before the "
      "combiner, gradients straight through (backends.quantization); "
      "refused by tpu_embedding_v0 (TF's V0 does not apply it)"
    ),
    "layout": (
      "passed to a TPU (SparseCore); refused elsewhere: the backends place "
      "their tables themselves"
    ),
    "dtype": (
      "passed to a TPU; float32 only elsewhere (narrow rows: the "
      "table's layout, EmbeddingPlacement.table_dtype)"
    ),
  },
  "FeatureConfig": {
    "table": "honoured",
    "max_sequence_length": "honoured: [B, L, D] activations",
    "validate_weights_and_indices": "honoured: the input checks",
    "output_shape": "honoured: activations reshaped to it + [D]",
    "name": "honoured: a label (TF's name of the feature)",
  },
  "QuantizationConfig": {
    "num_buckets": "honoured (an int >= 2)",
    "lower": "honoured (finite, below upper)",
    "upper": "honoured (finite, above lower)",
  },
  "SGD": dict(_OPTIMIZER_COMMON),
  "Adagrad": {
    **_OPTIMIZER_COMMON,
    **_SLOTS,
    "initial_accumulator_value": "honoured",
  },
  "AdagradMomentum": {
    **_OPTIMIZER_COMMON,
    **_SLOTS,
    "momentum": "honoured",
    "use_nesterov": "honoured",
    "exponent": "honoured",
    "beta2": "honoured",
    "epsilon": "honoured",
  },
  "Adam": {
    **_OPTIMIZER_COMMON,
    **_SLOTS,
    "beta_1": "honoured",
    "beta_2": "honoured",
    "epsilon": "honoured",
    "lazy_adam": "honoured: False updates every row every step",
    "sum_inside_sqrt": "honoured",
  },
  "FTRL": {
    **_OPTIMIZER_COMMON,
    **_SLOTS,
    "learning_rate_power": "honoured",
    "l1_regularization_strength": "honoured",
    "l2_regularization_strength": "honoured",
    "beta": "honoured",
    "initial_accumulator_value": "honoured",
    "multiply_linear_by_learning_rate": "honoured",
    "allow_zero_accumulator": "honoured",
  },
}
