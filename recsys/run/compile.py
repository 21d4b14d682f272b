"""Decides how a run's steps are compiled: XLA, as a TPU runs them, or not.

A TPU compiles every replica step with XLA; `train.jit_compile = True` does
the same on a CPU or GPU, which is how this project tests TPU readiness
without a TPU. One limit is TensorFlow's, not ours: XLA cannot compile the
collectives of several CPU replicas ("Collectives are not yet implemented
for CPU devices when compiling with XLA"). There the step runs uncompiled,
on the static shapes a compiled step would have (the embedding backend's
`static_shapes` path), so the numbers are still the compiled path's.

Example:
  >>> plan(tf.distribute.get_strategy(), jit_compile=True)
  CompilePlan(compile_steps=True, static_shapes=False, reason='...')
"""

import logging
from typing import NamedTuple

import tensorflow as tf

from backends import hardware

log = logging.getLogger("recsys.training")


class CompilePlan(NamedTuple):
  """How the replica steps run.

  Attributes:
    compile_steps: wrap each replica step in `tf.function(jit_compile=True)`.
    static_shapes: ask the embedding backend for its static-shape path
      although the step is not compiled (CPU replicas; see module doc).
    reason: one line for the log.
  """

  compile_steps: bool
  static_shapes: bool
  reason: str


def plan(
  strategy: tf.distribute.Strategy, jit_compile: bool | None
) -> CompilePlan:
  """The compile plan for `strategy`; logs it when compiling was asked for.

  Args:
    strategy: the run's strategy.
    jit_compile: True/False as set (`train.jit_compile`); None: on under a
      TPUStrategy (which compiles its steps anyway), off elsewhere.
  """
  if hardware.is_tpu(strategy):
    if jit_compile is False:
      log.warning(
        "train.jit_compile=False has no effect under a "
        "TPUStrategy: a TPU compiles every step."
      )
    return CompilePlan(False, False, "TPUStrategy compiles every replica step")
  if not jit_compile:
    return CompilePlan(False, False, "not asked for (train.jit_compile)")
  if hardware.is_parameter_server(strategy):
    result = CompilePlan(
      False,
      False,
      "parameter-server training: the steps read variables on "
      "other tasks, which XLA cannot compile; they run uncompiled",
    )
    log.warning("jit_compile: %s.", result.reason)
    return result
  replicas = strategy.num_replicas_in_sync
  if replicas > 1 and "CPU" in hardware.device_kinds(strategy):
    result = CompilePlan(
      False,
      True,
      f"{replicas} CPU replicas: XLA cannot compile CPU collectives, so the "
      "steps run uncompiled on the compiled path's static shapes",
    )
  else:
    result = CompilePlan(True, False, "each replica step compiled with XLA")
  log.info("jit_compile: %s.", result.reason)
  return result
