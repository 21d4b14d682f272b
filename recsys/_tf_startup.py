"""Starts TensorFlow for the command line quietly, and says once what it found.

TensorFlow writes start-up lines from C++ before its logging is initialised
(so `TF_CPP_MIN_LOG_LEVEL` cannot silence them): oneDNN and CUDA stub
notices and, on machines without a GPU driver, a `cuInit` error. They filled a
third of a short run's log. While TensorFlow is imported and its physical
devices are listed, the process's stderr goes to a temporary file; what is
known start-up noise is dropped, anything else is written back unchanged.

Example:
  >>> tf, devices = start(verbose=False)
  >>> devices
  'devices: 1 CPU, no GPU (CUDA drivers not found)'
"""

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

#: Substrings of TensorFlow's start-up lines that tell a run nothing.
NOISE = (
  "All log messages before absl::InitializeLog",
  "oneDNN custom operations are on",
  "cudart_stub.cc",
  "Could not find cuda drivers",
  "failed call to cuInit",
  "cpu_feature_guard.cc",
  "To enable the following instructions",
  "Unable to register cuDNN",
  "Unable to register cuFFT",
  "Unable to register cuBLAS",
  "computation placer already registered",
  "TF-TRT Warning",
)


def keep(lines: list[str]) -> list[str]:
  """The lines that are not known start-up noise."""
  return [line for line in lines if not any(n in line for n in NOISE)]


@contextlib.contextmanager
def filtered_stderr() -> Iterator[list[str]]:
  """Runs the block with fd 2 captured; yields the list of dropped lines."""
  dropped: list[str] = []
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      yield dropped
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      lines = capture.read().decode("utf-8", errors="replace").splitlines(True)
      kept = keep(lines)
      dropped.extend(line for line in lines if line not in kept)
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def start(verbose: bool) -> tuple[object, str]:
  """Imports TensorFlow (quietly unless `verbose`) and lists its devices.

  Only physical devices are listed, which does not start TensorFlow's
  runtime: logical CPUs can still be made afterwards.

  Returns:
    (the `tensorflow` module, a one-line description of the devices found).
  """
  context: contextlib.AbstractContextManager[list[str]] = (
    contextlib.nullcontext([]) if verbose else filtered_stderr()
  )
  with context as dropped:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    import recsys  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    cpus = tf.config.list_physical_devices("CPU")
    gpus = tf.config.list_physical_devices("GPU")
  found = [f"{len(cpus)} CPU"] + [f"{len(gpus)} GPU" if gpus else "no GPU"]
  why = ""
  if not gpus and any("cuda" in line.lower() for line in dropped):
    why = " (no usable CUDA driver)"
  return tf, f"devices: {', '.join(found)}{why}"
