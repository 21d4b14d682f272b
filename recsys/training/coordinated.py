"""Training under ParameterServerStrategy: ClusterCoordinator steps and data.

With a `ParameterServerStrategy` the trainer's process is the coordinator
(TF_CONFIG task "chief"): it owns no data and runs no training step itself.
It schedules functions on the workers with
`tf.distribute.coordinator.ClusterCoordinator`, each running a few training
steps on that worker's own input pipeline (`recsys.run.input`), while
the variables (the sharded embedding tables, the dense model, the optimizers,
the metrics) live on the parameter servers. Workers run asynchronously: one
replica per worker, each step is one worker's batch of `global_batch_size`
examples, no all-reduce.

`CoordinatedStepFunctions` has the interface of
`recsys.training.loop.StepFunctions` (`run_train_steps`), so the Trainer's
`train()` runs unchanged: the same step body (`train_step`) runs on the
workers; evaluation runs on the coordinator (`recsys.run.evaluation`), which
reads the parameter servers directly (every example once, in order), and
checkpoints and summaries are written by the coordinator.

A worker that dies mid-run is survived as TF's coordinator allows: the
functions it was running are rescheduled on the other workers (and on it
again once it is back), so exactly the requested number of steps runs.
Losing a parameter server or the coordinator ends the run; restart it and it
resumes from the last checkpoint.

Example:
  >>> coordinator = strategy_lib.make_coordinator(strategy)
  >>> dataset = input.training_input(strategy, source, 512, preprocess,
  ...                                coordinator=coordinator)
  >>> steps = CoordinatedStepFunctions(coordinator, strategy, model, backend,
  ...                                  optimizer, 512, global_step, loss)
  >>> steps.run_train_steps(iter(dataset), 100)
"""

import logging
import math

from recsys._keras import tf
from recsys.run.strategy import num_workers
from recsys.training import loop as loop_lib

log = logging.getLogger("recsys.training")

#: Training steps a scheduled function runs on a worker before returning:
#: fewer means finer load balancing and faster recovery, more means less
#: scheduling overhead (one RPC round trip per function).
STEPS_PER_FUNCTION = 10


class CoordinatedStepFunctions(loop_lib.StepFunctions):
  """`StepFunctions` whose training steps the coordinator schedules on workers.

  Args:
    coordinator: the strategy's `ClusterCoordinator`.
    *args, **kwargs: those of `recsys.training.loop.StepFunctions`.

  The step body (`train_step`: lookup, loss, dense and embedding updates, the
  non-finite check) is the one every strategy runs; `run_train_steps`
  schedules it in functions of at most `STEPS_PER_FUNCTION` steps and waits
  for all of them, then sets the step counter to exactly the steps requested
  (a function retried after its worker died may have counted some twice).
  """

  def __init__(self, coordinator, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._coordinator = coordinator

  def run_train_steps(self, iterator, num_steps: int) -> None:
    """Schedules `num_steps` steps on the workers and waits for them."""
    start = int(self._global_step.numpy())
    workers = num_workers(self._strategy)
    per_function = max(
      1, min(STEPS_PER_FUNCTION, math.ceil(num_steps / workers))
    )
    remaining = num_steps
    while remaining > 0:
      n = min(per_function, remaining)
      self._coordinator.schedule(
        self.train_loop, args=(iterator, tf.constant(n, tf.int32))
      )
      remaining -= n
    self._coordinator.join()
    self._global_step.assign(start + num_steps)
