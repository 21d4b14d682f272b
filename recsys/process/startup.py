"""Starts TensorFlow for a `recsys` command: logs, devices, threads.

The command line's flags say how (`--verbose`, `--intra_op_threads`,
`--inter_op_threads`); this module does it once per process, before the
command's first TensorFlow op.
"""

import logging
from typing import Any

from recsys import _tf_startup
from recsys.process import console, threads

log = logging.getLogger("recsys")


def start_tensorflow(
  verbose: bool = False, intra_op_threads: int = 0, inter_op_threads: int = 0
) -> None:
  """Imports TensorFlow quietly, says what it found and sets its threads
  (the command's logging is `recsys.process.console`'s).

  Args:
    verbose: keep TensorFlow's own logs (else only its errors).
    intra_op_threads: TF intra-op threads (0: `threads.thread_settings`).
    inter_op_threads: TF inter-op threads (0: likewise).

  Raises:
    RuntimeError: threads were asked for explicitly but TensorFlow's
      runtime already runs in this process (recsys called as a library).
  """
  # Unless the user set TF_CPP_MIN_LOG_LEVEL: TF's errors only, or all.
  _tf_startup.set_log_level(None if verbose else "2")
  tf_module, devices = _tf_startup.start(verbose)
  tf: Any = tf_module
  log.info(devices, extra=console.shown_as(console.DEVICES))
  if not verbose:
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.WARNING)
  intra, inter, why = threads.thread_settings(
    intra_op_threads, inter_op_threads, threads.available_cores()
  )
  try:
    if intra:
      tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
      tf.config.threading.set_inter_op_parallelism_threads(inter)
  except RuntimeError:  # TF already running in this process (a library call)
    if not why:
      raise
    why = ""
  if why:
    log.info(why)
