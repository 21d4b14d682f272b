"""Fault injection for real: SIGKILL at random points, SIGTERM, truncated files.

Each test runs the trainer in subprocesses (`train_worker.py`: a checkpoint
after every step, so kills often land inside a checkpoint write) and asserts
that nothing was lost: every restart resumes from the newest complete
checkpoint, and the run's final tables, slots, dense weights and optimizer
state are bit-identical to one uninterrupted run's.
"""

import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
TRIALS = int(
  os.environ.get("RECSYS_CRASH_TRIALS", "3")
)  # a soak: set it higher
# Each life of the SIGKILL test is killed within its first few steps (after
# at most 3 printed, then at most 0.15 s more): 10 steps a trial keep every
# kill before the run's end, a soak's too (60 steps for any number of trials
# before: the SIGKILL test's last life and the SIGTERM test's trained ~55).
STEPS = max(30, 10 * TRIALS)
LINE_TIMEOUT = 240.0  # seconds to wait for one progress line (a busy CI box)

pytestmark = pytest.mark.slow


class Worker:
  """One life of the training process, its stdout read line by line."""

  def __init__(self, model_dir, out_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    self.log_path = f"{out_path}.{time.time():.3f}.log"
    with open(self.log_path, "w", encoding="utf-8") as log:
      self.proc = subprocess.Popen(
        [
          sys.executable,
          "-m",
          "tests.reliability.train_worker",
          str(model_dir),
          str(out_path),
          str(STEPS),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
      )
    self.lines = queue.Queue()
    threading.Thread(target=self._pump, daemon=True).start()

  def _pump(self):
    for line in self.proc.stdout:
      self.lines.put(line.strip())
    self.lines.put(None)

  def expect(self, prefix):
    """Waits for the next line starting with `prefix`; returns its number."""
    deadline = time.time() + LINE_TIMEOUT
    while time.time() < deadline:
      try:
        line = self.lines.get(timeout=max(0.1, deadline - time.time()))
      except queue.Empty:
        break
      if line is None:
        if self.proc.wait() not in (0, 143):
          with open(self.log_path, encoding="utf-8") as f:
            raise AssertionError(f"worker failed:\n{f.read()[-3000:]}")
        return None
      if line.startswith(prefix):
        return int(line.split()[1])
    self.kill()
    raise AssertionError(f"no {prefix!r} line within {LINE_TIMEOUT} s")

  def kill(self, sig=signal.SIGKILL):
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, sig)

  def wait(self):
    try:
      return self.proc.wait(timeout=LINE_TIMEOUT)
    finally:
      self.kill()


def latest_checkpoint_step(model_dir):
  """The step of the checkpoint TF's state file publishes (0 if none)."""
  path = os.path.join(model_dir, "checkpoints", "checkpoint")
  if not os.path.exists(path):
    return 0
  with open(path, encoding="utf-8") as f:
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', f.read(), re.M)
  return int(match.group(1)) if match else 0


def assert_same_state(path_a, path_b):
  a, b = np.load(path_a), np.load(path_b)
  assert sorted(a.files) == sorted(b.files)
  for key in a.files:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The final state of one uninterrupted run."""
  run = tmp_path_factory.mktemp("reference")
  worker = Worker(run / "model", run / "final.npz")
  assert worker.expect("resumed") == 0
  assert worker.wait() == 0
  return run / "final.npz"


def test_sigkill_at_random_points_loses_nothing(tmp_path, reference):
  rng = random.Random(20261129)
  model_dir, out = tmp_path / "model", tmp_path / "final.npz"
  kills = []
  while True:
    expected = latest_checkpoint_step(model_dir)
    worker = Worker(model_dir, out)
    resumed = worker.expect("resumed")
    assert resumed == expected, (
      f"life {len(kills) + 1} resumed at {resumed}, newest complete "
      f"checkpoint is {expected} (kills so far: {kills})"
    )
    if len(kills) >= TRIALS:
      assert worker.wait() == 0
      break
    # Kill after a random number of steps, at a random moment inside the
    # next step + checkpoint write; sometimes before the first step (during
    # tracing and the first save).
    steps = rng.randint(0, 3)
    seen = resumed
    for _ in range(steps):
      seen = worker.expect("step") or seen
    time.sleep(rng.uniform(0.0, 0.15))
    worker.kill()
    worker.wait()
    kills.append(seen)
    assert latest_checkpoint_step(model_dir) >= seen - 1, (
      f"printed step {seen} but the newest checkpoint is "
      f"{latest_checkpoint_step(model_dir)}: more than one step lost"
    )
  assert len(kills) >= TRIALS
  assert_same_state(out, reference)


def test_sigterm_saves_and_a_truncated_checkpoint_is_skipped(
  tmp_path, reference
):
  model_dir, out = tmp_path / "model", tmp_path / "final.npz"
  worker = Worker(model_dir, out)
  assert worker.expect("resumed") == 0
  worker.expect("step")
  worker.expect("step")
  worker.kill(signal.SIGTERM)
  stopped = worker.expect("preempted")
  assert worker.wait() == 143
  assert stopped >= 2 and latest_checkpoint_step(model_dir) == stopped

  # Damage the newest checkpoint after the fact (a disk error): the next run
  # must skip it, resume from the one before, and keep the damaged files.
  data = [
    f
    for f in os.listdir(model_dir / "checkpoints")
    if f.startswith(f"ckpt-{stopped}.data")
  ]
  assert data
  path = model_dir / "checkpoints" / data[0]
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size // 2)
  worker = Worker(model_dir, out)
  assert worker.expect("resumed") == stopped - 1
  assert worker.wait() == 0
  assert_same_state(out, reference)
