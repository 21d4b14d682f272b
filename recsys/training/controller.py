"""When a training run evaluates, checkpoints, logs and stops: its timing.

The Trainer builds a run and knows what its parts do: run steps, check them,
save a checkpoint, write summaries (`TrainingRun`); its evaluator scores
the model (`Evaluating`, `recsys.run.evaluation.Evaluator`). The
`Controller` owns both and decides when. It runs the steps in loops that
end at step boundaries (`LoopSchedule.next_boundary`: `steps_per_loop`
steps on, or the next evaluation or checkpoint step, or the last step),
checks each loop's steps before anything is saved, writes the loop's
summaries and progress, saves and evaluates at their steps, and stops on a
stop request (SIGTERM, Ctrl-C) that every worker agreed on, with a
checkpoint at the exact step. After the last step it saves (unless that
step is saved), evaluates once more and returns the run's final metrics.

Orbit (TF Model Garden) separates its controller from the trainer for the
same reason: the timing can be read, and tested, apart from the model
(tests/training/test_controller.py drives it with a fake run).

Example:
  >>> schedule = LoopSchedule(train_steps=1000, steps_per_loop=100,
  ...                         eval_every=500, checkpoint_every=250)
  >>> final = Controller(trainer, trainer.evaluator, schedule,
  ...                    global_batch_size=512).train(
  ...   step=0, stop=signals.StopRequests())
"""

import dataclasses
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any, Protocol

from recsys.process import console
from recsys.run import run_summaries
from recsys.training import signals as signals_lib

log = logging.getLogger("recsys.training")


class TrainingRun(Protocol):
  """What the controller asks of a run (the Trainer); when is its own."""

  def run_steps(self, num_steps: int) -> None:
    """Runs `num_steps` training steps; the loop's metrics start afresh."""

  def check_steps(self) -> None:
    """Raises if the steps just run went wrong (invalid ids, NaN/inf)."""

  def train_results(self) -> dict[str, float]:
    """The loop's training metrics: `train/loss`, ..., `learning_rate`."""
    ...

  def save(self) -> str:
    """Saves a checkpoint at the current step; returns its path."""
    ...

  def save_if_new(self, step: int) -> str:
    """Saves a checkpoint unless the newest one holds `step`."""
    ...

  def end_training(self) -> None:
    """The last loop ran and is saved: releases what only training needed
    (the input pipeline and its threads) before the final evaluation."""

  def write_summaries(
    self, kind: str, values: Mapping[str, float], step: int
  ) -> None:
    """Writes `values` to the `kind` ("train", "eval") summaries."""

  def agreed_stop(self, requested: str | None) -> str | None:
    """The stop signal every worker agreed on (None: go on)."""
    ...


class Evaluating(Protocol):
  """What the controller asks of an evaluator
  (`recsys.run.evaluation.Evaluator`)."""

  def evaluate(self) -> dict[str, float]:
    """Evaluates the model now: `eval/<metric>`."""
    ...


@dataclasses.dataclass(frozen=True)
class LoopSchedule:
  """When things happen, in steps; an `every` of 0 turns that event off.

  Attributes:
    train_steps: the step training ends at.
    steps_per_loop: the most steps one compiled loop runs between two
      returns to Python (where summaries, checkpoints and stops happen).
    eval_every: evaluate at every multiple of it before `train_steps` (the
      final evaluation follows the last step whatever it is).
    checkpoint_every: save at every multiple of it.
  """

  train_steps: int
  steps_per_loop: int = 1
  eval_every: int = 0
  checkpoint_every: int = 0

  @classmethod
  def of_settings(cls, settings: Any) -> "LoopSchedule":
    """The schedule a run's `TrainSettings` set, as plain ints (a NumPy
    integer from a Python caller too; an `every` of None is 0)."""
    return cls(
      train_steps=int(settings.train_steps),
      steps_per_loop=max(1, int(settings.steps_per_loop)),
      eval_every=int(settings.eval_every or 0),
      checkpoint_every=int(settings.checkpoint_every or 0),
    )

  def next_boundary(self, step: int) -> int:
    """Where the loop starting at `step` ends: `steps_per_loop` on, the
    next evaluation or checkpoint step, or `train_steps`, the nearest."""
    end = min(self.train_steps, step + max(1, self.steps_per_loop))
    for every in (self.eval_every, self.checkpoint_every):
      if every:
        end = min(end, (step // every + 1) * every)
    return end

  def saves_at(self, step: int) -> bool:
    """Whether a checkpoint is due at `step` (a loop's end)."""
    return bool(self.checkpoint_every) and step % self.checkpoint_every == 0

  def evaluates_at(self, step: int) -> bool:
    """Whether a periodic evaluation is due at `step` (a loop's end)."""
    return (
      bool(self.eval_every)
      and step % self.eval_every == 0
      and step < self.train_steps
    )


def _on_a_terminal() -> bool:
  """Whether stdout and stderr are terminals: a progress bar's \\r frames in
  a log file or pipe glue onto the log lines, so there it logs lines."""
  return all(
    getattr(stream, "isatty", lambda: False)()
    for stream in (sys.stdout, sys.stderr)
  )


class Progress:
  """A run's progress: a tqdm bar on a terminal, else a log line per loop.

  The brief console (`recsys.process.console`) shows about one line in
  ten of the run, and its last; `info` every loop's.

  Args:
    step: the step training starts at.
    train_steps: the step it ends at.
    bar: show a bar when on a terminal and tqdm is installed.
  """

  def __init__(self, step: int, train_steps: int, bar: bool = True):
    self._train_steps = train_steps
    self._bar = self._make_bar(step, train_steps) if bar else None
    self._tenth = self._tenths(step)

  def _tenths(self, step: int) -> int:
    return 10 * step // max(self._train_steps, 1)

  @staticmethod
  def _make_bar(step: int, train_steps: int) -> Any:
    if not _on_a_terminal():
      return None
    try:
      from tqdm import auto as tqdm  # pylint: disable=g-import-not-at-top
    except ImportError:
      return None
    return tqdm.tqdm(
      total=train_steps,
      initial=step,
      unit="step",
      dynamic_ncols=True,
      desc="train",
    )

  def show(self, step: int, loss: float, examples_per_second: float) -> None:
    """The loop that ended at `step`: its loss and speed."""
    if self._bar is None:
      tenth = self._tenths(step)
      shown = tenth > self._tenth or step >= self._train_steps
      self._tenth = max(tenth, self._tenth)
      log.info(
        "step %d/%d loss %.5f %.0f examples/s",
        step,
        self._train_steps,
        loss,
        examples_per_second,
        extra=console.shown_as(console.PROGRESS) if shown else None,
      )
      return
    self._bar.update(step - self._bar.n)
    self._bar.set_postfix(
      loss=f"{loss:.4f}", ex_s=f"{examples_per_second:,.0f}"
    )

  def close(self) -> None:
    """Ends the bar (its last frame stays on the terminal)."""
    if self._bar is not None:
      self._bar.close()


class Controller:
  """Runs a `TrainingRun` to `schedule.train_steps` and its evaluator at
  the evaluation steps, deciding when it evaluates, saves, writes summaries
  and stops (as Orbit's controller owns its trainer and evaluator).

  Args:
    run: what training does (the Trainer).
    evaluator: what evaluation does (`recsys.run.evaluation.Evaluator`).
    schedule: when.
    global_batch_size: examples per step (the speed in examples/s).
    progress_bar: a tqdm bar on a terminal (else log lines).
  """

  def __init__(
    self,
    run: TrainingRun,
    evaluator: Evaluating,
    schedule: LoopSchedule,
    global_batch_size: int,
    progress_bar: bool = True,
  ):
    self.run = run
    self.evaluator = evaluator
    self.schedule = schedule
    self.global_batch_size = global_batch_size
    self.progress_bar = progress_bar

  def train(
    self, step: int, stop: signals_lib.StopRequests
  ) -> dict[str, float]:
    """Trains from `step` to `train_steps`, saves, evaluates once more.

    Args:
      step: the step training starts at (a resumed run's restored step).
      stop: the process's stop requests, read after every loop.

    Returns:
      The last loop's training results (without its `examples_per_second`),
      the run's throughput (`run_summaries.throughput`), the final
      evaluation, `step` and `elapsed_seconds`.

    Raises:
      TrainingPreempted: a stop was agreed before `train_steps`; a
        checkpoint at the step reached was saved first.
    """
    run, schedule = self.run, self.schedule
    progress = Progress(step, schedule.train_steps, self.progress_bar)
    results: dict[str, float] = {}
    loops: list[tuple[int, float]] = []  # (steps, seconds) of each loop
    start_time = time.time()
    while step < schedule.train_steps:
      end = schedule.next_boundary(step)
      results = self._run_loop(step, end, loops)
      step = end
      run.write_summaries("train", results, step)
      progress.show(step, results["train/loss"], results["examples_per_second"])
      if schedule.saves_at(step):
        run.save()
      if schedule.evaluates_at(step):
        self.evaluate(step)
      signal_name = run.agreed_stop(stop.requested)  # every worker asks
      if signal_name and step < schedule.train_steps:
        progress.close()
        path = run.save_if_new(step)
        raise signals_lib.TrainingPreempted(step, path, signal_name)
    progress.close()
    # Saving tables (GiB for Criteo), releasing the input pipeline and a
    # whole evaluation take seconds to minutes: say so, or the run looks
    # hung after its progress.
    log.info(
      "step %d: the final checkpoint and evaluation ...",
      step,
      extra=console.shown_as(console.STATUS),
    )
    run.save_if_new(step)
    final = dict(results)
    final.pop("examples_per_second", None)  # the last loop's; the run's:
    final.update(
      run_summaries.throughput(
        loops, time.time() - start_time, self.global_batch_size
      )
    )
    run.end_training()  # after the run's rates, as before: they do not move
    final.update(self.evaluate(step))
    final["step"] = step
    final["elapsed_seconds"] = time.time() - start_time
    return final

  def _run_loop(
    self, step: int, end: int, loops: list[tuple[int, float]]
  ) -> dict[str, float]:
    """Runs the steps from `step` to `end`, checks them before anything is
    saved or written, and returns their results with their speed."""
    t0 = time.time()
    self.run.run_steps(end - step)
    self.run.check_steps()
    results = self.run.train_results()
    elapsed = time.time() - t0
    loops.append((end - step, elapsed))
    results["examples_per_second"] = (
      (end - step) * self.global_batch_size / elapsed
    )
    return results

  def evaluate(self, step: int) -> dict[str, float]:
    """Evaluates the model at `step`; writes the `eval/` results'
    summaries and a log line, and returns the results."""
    results = self.evaluator.evaluate()
    evals = {k: v for k, v in results.items() if k.startswith("eval/")}
    self.run.write_summaries("eval", evals, step)
    log.info(
      "eval at step %d: %s",
      step,
      ", ".join(f"{k}={v:.5f}" for k, v in sorted(evals.items())),
    )
    return results
