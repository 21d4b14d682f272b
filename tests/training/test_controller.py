"""The training loop's timing (`recsys.training.controller`), without TF.

A fake run records what the controller asks of it; each expected sequence
is written out by hand from what the settings mean: a loop ends every
`steps_per_loop` steps and at every evaluation or checkpoint step; a
checkpoint at every multiple of `checkpoint_every`; an evaluation at every
multiple of `eval_every` before the last step, and once after it; a stop
request read after the loop it arrived in, then a checkpoint at that step.
"""

import logging
import re
import time

import pytest

from recsys.process import console
from recsys.training import signals
from recsys.training.controller import Controller, LoopSchedule


class FakeRun:
  """A `TrainingRun` (and its evaluator) that counts steps and records
  every call, in one list: the order the controller calls them in.

  Args:
    step: the step the run is at (a resume's restored step).
    stop: the stop requests the controller reads.
    stop_at: a signal arrives while the step reaching it runs.
  """

  def __init__(self, step=0, stop=None, stop_at=None):
    self.step, self.stop, self.stop_at = step, stop, stop_at
    self.calls = []

  def run_steps(self, num_steps):
    self.calls.append(("run", self.step, self.step + num_steps))
    time.sleep(1e-3)  # a loop takes time: its speed is finite
    if self.stop_at is not None and self.step < self.stop_at:
      if self.step + num_steps >= self.stop_at:
        self.stop.requested = "SIGTERM"
    self.step += num_steps

  def check_steps(self):
    self.calls.append(("check", self.step))

  def train_results(self):
    return {"train/loss": 0.25, "learning_rate": 0.1}

  def evaluate(self):
    self.calls.append(("evaluate", self.step))
    return {"eval/auc": 0.75, "eval/loss": 0.5}

  def save(self):
    self.calls.append(("save", self.step))
    return f"ckpt-{self.step}"

  def save_if_new(self, step):
    self.calls.append(("save_if_new", step))
    return f"ckpt-{step}"

  def end_training(self):
    self.calls.append(("end_training", self.step))

  def write_summaries(self, kind, values, step):
    self.calls.append(("summaries", kind, step, tuple(sorted(values))))

  def agreed_stop(self, requested):
    self.calls.append(("agreed_stop", self.step))
    return requested


def _train(schedule, step=0, stop_at=None):
  """(the run's calls, the final metrics or the TrainingPreempted)."""
  stop = signals.StopRequests()  # not entered: no handler, a plain flag
  run = FakeRun(step, stop, stop_at)
  controller = Controller(
    run, run, schedule, global_batch_size=8, progress_bar=0
  )
  try:
    outcome = controller.train(step, stop)
  except signals.TrainingPreempted as e:
    outcome = e
  return run.calls, outcome


def _events(calls):
  """The calls that decide a run's files and metrics: steps, evaluations,
  checkpoints (not the checks, summaries and stop agreements of each loop)."""
  keep = ("run", "evaluate", "save", "save_if_new")
  return [c for c in calls if c[0] in keep]


TRAIN = (
  "summaries",
  "train",
  None,
  ("examples_per_second", "learning_rate", "train/loss"),
)
EVAL = ("eval/auc", "eval/loss")


def test_every_call_of_a_run_comes_in_its_order():
  """10 steps, 4 a loop, a checkpoint every 3, an evaluation every 5: loops
  end at 3 (checkpoint), 5 (evaluation), 6 and 9 (checkpoints) and 10.
  Each loop's steps are checked before anything is written, then its
  summaries, checkpoint, evaluation and the stop agreement every worker
  takes part in; after the last: a checkpoint if new and the evaluation."""
  schedule = LoopSchedule(
    train_steps=10, steps_per_loop=4, eval_every=5, checkpoint_every=3
  )
  calls, final = _train(schedule)

  def loop(start, end):
    return [
      ("run", start, end),
      ("check", end),
      TRAIN[:2] + (end,) + TRAIN[3:],
    ]

  assert calls == [
    *loop(0, 3),
    ("save", 3),
    ("agreed_stop", 3),
    *loop(3, 5),
    ("evaluate", 5),
    ("summaries", "eval", 5, EVAL),
    ("agreed_stop", 5),
    *loop(5, 6),
    ("save", 6),
    ("agreed_stop", 6),
    *loop(6, 9),
    ("save", 9),
    ("agreed_stop", 9),
    *loop(9, 10),
    ("agreed_stop", 10),
    ("save_if_new", 10),
    ("end_training", 10),  # the input released before the evaluation
    ("evaluate", 10),
    ("summaries", "eval", 10, EVAL),
  ]
  assert final["step"] == 10
  assert final["train/loss"] == 0.25 and final["eval/auc"] == 0.75
  assert "examples_per_second" not in final  # the last loop's, dropped
  assert final["examples_per_second_whole_run"] > 0
  assert final["examples_per_second_steady"] > 0
  assert final["elapsed_seconds"] > 0


def test_a_last_loop_shorter_than_steps_per_loop_ends_at_train_steps():
  calls, final = _train(LoopSchedule(train_steps=10, steps_per_loop=4))
  assert _events(calls) == [
    ("run", 0, 4),
    ("run", 4, 8),
    ("run", 8, 10),
    ("save_if_new", 10),
    ("evaluate", 10),
  ]
  assert final["step"] == 10


def test_an_evaluation_due_at_the_last_step_runs_once():
  schedule = LoopSchedule(
    train_steps=8, steps_per_loop=8, eval_every=4, checkpoint_every=4
  )
  assert _events(_train(schedule)[0]) == [
    ("run", 0, 4),
    ("save", 4),
    ("evaluate", 4),
    ("run", 4, 8),
    ("save", 8),
    ("save_if_new", 8),  # the run saves only a step not saved yet
    ("evaluate", 8),
  ]


def test_a_resumed_run_keeps_the_schedule_of_the_whole_run():
  """From step 7 of 12, a checkpoint every 5: the first loop ends at the
  checkpoint step 10, not 4 steps on; then 10 -> 12."""
  schedule = LoopSchedule(train_steps=12, steps_per_loop=4, checkpoint_every=5)
  calls, final = _train(schedule, step=7)
  assert _events(calls) == [
    ("run", 7, 10),
    ("save", 10),
    ("run", 10, 12),
    ("save_if_new", 12),
    ("evaluate", 12),
  ]
  assert final["step"] == 12


def test_a_finished_run_resumed_saves_if_new_and_evaluates():
  calls, final = _train(LoopSchedule(train_steps=6, steps_per_loop=4), step=6)
  assert calls == [
    ("save_if_new", 6),
    ("end_training", 6),
    ("evaluate", 6),
    ("summaries", "eval", 6, EVAL),
  ]
  assert final["step"] == 6 and "train/loss" not in final
  assert "examples_per_second_whole_run" not in final


def test_a_stop_request_ends_the_loop_it_arrived_in_with_a_checkpoint():
  """A signal during step 7 (loop 6 -> 8): the loop finishes, its
  evaluation due at 8 runs, then a checkpoint at 8 and TrainingPreempted;
  no further step, no final evaluation."""
  schedule = LoopSchedule(
    train_steps=20, steps_per_loop=4, eval_every=8, checkpoint_every=6
  )
  calls, preempted = _train(schedule, stop_at=7)
  assert _events(calls) == [
    ("run", 0, 4),
    ("run", 4, 6),
    ("save", 6),
    ("run", 6, 8),
    ("evaluate", 8),
    ("save_if_new", 8),
  ]
  assert isinstance(preempted, signals.TrainingPreempted)
  assert (preempted.step, preempted.checkpoint) == (8, "ckpt-8")
  assert preempted.signal_name == "SIGTERM"


def test_a_stop_request_at_a_checkpoint_step_saves_once():
  schedule = LoopSchedule(train_steps=20, steps_per_loop=4, checkpoint_every=6)
  calls, preempted = _train(schedule, stop_at=5)
  assert _events(calls) == [
    ("run", 0, 4),
    ("run", 4, 6),
    ("save", 6),
    ("save_if_new", 6),  # the checkpoint just saved: nothing new
  ]
  assert preempted.step == 6


def test_a_stop_request_in_the_last_loop_lets_the_run_finish():
  calls, final = _train(
    LoopSchedule(train_steps=8, steps_per_loop=4), stop_at=6
  )
  assert _events(calls) == [
    ("run", 0, 4),
    ("run", 4, 8),
    ("save_if_new", 8),
    ("evaluate", 8),
  ]
  assert final["step"] == 8


def test_a_failed_check_stops_before_anything_is_written():
  class Failing(FakeRun):
    def check_steps(self):
      super().check_steps()
      raise FloatingPointError("NaN")

  run = Failing()
  schedule = LoopSchedule(train_steps=4, steps_per_loop=2, checkpoint_every=2)
  with pytest.raises(FloatingPointError):
    Controller(run, run, schedule, 8, progress_bar=False).train(
      0, signals.StopRequests()
    )
  assert run.calls == [("run", 0, 2), ("check", 2)]


@pytest.mark.parametrize(
  "every, starts, ends",
  [
    # steps_per_loop 4 of 10 steps: the last loop is short.
    ({}, [0, 4, 8], [4, 8, 10]),
    # evaluation every 3 cuts the loops at 3, 6, 9, from anywhere.
    ({"eval_every": 3}, [0, 3, 4, 6, 8, 9], [3, 6, 6, 9, 9, 10]),
    # both: the nearest of 4 on, the next multiple of 3 and of 5.
    (
      {"eval_every": 3, "checkpoint_every": 5},
      [1, 3, 5, 6, 9],
      [3, 5, 6, 9, 10],
    ),
  ],
)
def test_next_boundary_is_the_nearest_event(every, starts, ends):
  schedule = LoopSchedule(train_steps=10, steps_per_loop=4, **every)
  assert [schedule.next_boundary(s) for s in starts] == ends


def test_periodic_events_are_due_at_multiples_and_never_when_off():
  schedule = LoopSchedule(train_steps=10, eval_every=5, checkpoint_every=4)
  assert [s for s in range(11) if schedule.saves_at(s)] == [0, 4, 8]
  # The evaluation at the last step is the final one, not a periodic one.
  assert [s for s in range(11) if schedule.evaluates_at(s)] == [0, 5]
  off = LoopSchedule(train_steps=10)
  assert not any(off.saves_at(s) or off.evaluates_at(s) for s in range(11))
  assert LoopSchedule(train_steps=10, steps_per_loop=0).next_boundary(3) == 4


def test_without_a_bar_each_loop_and_evaluation_logs_a_line(caplog):
  caplog.set_level(logging.INFO, "recsys.training")
  _train(LoopSchedule(train_steps=4, steps_per_loop=2, eval_every=2))
  lines = [r.getMessage() for r in caplog.records]
  steps = [line for line in lines if re.match(r"step \d+/", line)]
  assert [line.split(" loss ")[0] for line in steps] == ["step 2/4", "step 4/4"]
  assert "loss 0.25000" in steps[0] and steps[0].endswith(" examples/s")
  evals = [line for line in lines if line.startswith("eval at step")]
  assert evals == [
    "eval at step 2: eval/auc=0.75000, eval/loss=0.50000",
    "eval at step 4: eval/auc=0.75000, eval/loss=0.50000",
  ]


def test_brief_output_shows_a_tenth_of_the_loops_then_what_runs_last(caplog):
  """Without a bar the brief console (`recsys.process.console`) shows the
  loops that end a tenth of the run, then a line before the final save and
  evaluation (they ran silently after the last loop's line)."""
  caplog.set_level(logging.INFO, "recsys.training")
  _train(LoopSchedule(train_steps=100, steps_per_loop=2))
  shown = [
    r.getMessage()
    for r in caplog.records
    if console.kind_of(r) in (console.PROGRESS, console.STATUS)
  ]
  assert [line.split(" loss")[0] for line in shown[:-1]] == [
    f"step {step}/100" for step in range(10, 101, 10)
  ]
  assert shown[-1] == "step 100: the final checkpoint and evaluation ..."
