"""Optimizer cases more than one backend test trains with."""

import tensorflow as tf

E = tf.tpu.experimental.embedding


def adagrad_with_options() -> E.Adagrad:
  """Adagrad with every option its update math reads set (an initial
  accumulator, gradient clipping, weight decay scaled by the learning rate,
  weight clipping)."""
  return E.Adagrad(
    0.1,
    initial_accumulator_value=0.5,
    clipvalue=0.3,
    weight_decay_factor=0.01,
    multiply_weight_decay_factor_by_learning_rate=True,
    clip_weight_min=-0.4,
    clip_weight_max=0.4,
  )
