"""Op-time table of a few TF steps, from the TF profiler's trace.

Used by `embedding_step.py --profile` and `dlrm_step.py --profile`: runs the
steps under `tf.profiler.experimental`, then sums each op type's time on
TF's compute threads from the trace (`*.xplane.pb`), per step. Op time on
several threads adds up: 2 busy threads give about 2x the wall time.

    rows = profile_steps(lambda: step(batch), steps=20, logdir="/tmp/prof")
    print_op_table(rows)
"""

import collections
import glob
import os
import tempfile
from collections.abc import Callable


def profile_steps(
  run_step: Callable[[], None],
  steps: int,
  logdir: str | None = None,
  steps_per_call: int = 1,
) -> list[tuple[str, float]]:
  """(op type, microseconds per step) over `steps` calls, largest first.

  `steps_per_call`: training steps each call runs (a compiled loop).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

  logdir = logdir or tempfile.mkdtemp(prefix="recsys_profile_")
  tf.profiler.experimental.start(logdir)
  try:
    for _ in range(steps):
      run_step()
  finally:
    tf.profiler.experimental.stop()
  paths = sorted(
    glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")),
    key=os.path.getmtime,
  )
  space = xplane_pb2.XSpace()
  with open(paths[-1], "rb") as f:
    space.ParseFromString(f.read())
  totals = collections.Counter()
  for plane in space.planes:
    names = plane.event_metadata
    for line in plane.lines:
      if not line.name.startswith("tf_"):  # TF's compute threads only
        continue
      for event in line.events:
        name = names[event.metadata_id].name
        if ":" in name and "::" not in name:  # "op_name:OpType", not C++ scopes
          totals[name.rsplit(":", 1)[1]] += event.duration_ps / 1e6
  per_step = steps * steps_per_call
  return [(op, us / per_step) for op, us in totals.most_common()]


def print_op_table(rows: list[tuple[str, float]], top: int = 20) -> None:
  total = sum(us for _, us in rows) or 1.0
  print(f"| op type (top {top}) | op us per step | share |")
  print("|---|---|---|")
  for op, us in rows[:top]:
    print(f"| {op} | {us:.0f} | {100 * us / total:.0f} % |")
  print(f"| all ops | {total:.0f} | 100 % |")
