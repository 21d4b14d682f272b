"""Starts TensorFlow quietly, for the command line and for `import recsys`.

TensorFlow writes start-up lines from C++ before its logging is initialised
(so `TF_CPP_MIN_LOG_LEVEL` cannot silence them): oneDNN and CUDA stub
notices and, on machines without a GPU driver, a `cuInit` error. They filled a
third of a short run's log, and came before the first useful line of a
script that imports recsys and then TensorFlow (9 lines). While TensorFlow
is imported and its physical devices are listed, the process's stderr goes
to a temporary file; what is known start-up noise is dropped, anything else
is written back unchanged (a real error is shown, after the import).

The command line does this in `start`; `import recsys` arranges it for the
script's own `import tensorflow` (`quiet_tensorflow_import`), and makes
TensorFlow's C++ log only warnings and errors, unless the user set
`TF_CPP_MIN_LOG_LEVEL` (then neither: they asked for what TF logs).

Example:
  >>> tf, devices = start(verbose=False)
  >>> devices
  'devices: 1 CPU, no GPU (CUDA drivers not found)'
"""

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
#: The user's own `TF_CPP_MIN_LOG_LEVEL` when recsys was imported (None:
#: unset, recsys chooses).
_USER_LOG_LEVEL = os.environ.get(LOG_LEVEL)

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
  "oneDNN supports DT_INT64 only on platforms with AVX-512",
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


def set_log_level(level: str | None) -> None:
  """TensorFlow's C++ log level before it is imported: `level` (None: TF's
  default, all), unless the user set `TF_CPP_MIN_LOG_LEVEL` themselves."""
  if _USER_LOG_LEVEL is not None:
    os.environ[LOG_LEVEL] = _USER_LOG_LEVEL
  elif level is None:
    os.environ.pop(LOG_LEVEL, None)
  else:
    os.environ[LOG_LEVEL] = level


class _QuietLoader(importlib.abc.Loader):
  """TensorFlow's own loader, run with stderr filtered (`filtered_stderr`),
  its physical devices listed inside (the `cuInit` error comes then)."""

  def __init__(self, loader: Any):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module) -> None:
    with filtered_stderr():
      self.loader.exec_module(module)
      module.config.list_physical_devices()  # starts no runtime
    module.__loader__ = self.loader  # TF's own, as if imported directly
    if module.__spec__ is not None:
      module.__spec__.loader = self.loader


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` as Python does, once, with `_QuietLoader`."""

  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname != "tensorflow":
      return None
    uninstall_quiet_import()  # once; the others find the real spec
    spec = importlib.util.find_spec(fullname)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


def quiet_tensorflow_import() -> None:
  """`import recsys`'s part: TensorFlow imported after it starts quietly.

  Nothing when TensorFlow is imported already, or when the user set
  `TF_CPP_MIN_LOG_LEVEL` (they chose what TF logs). Else TF's C++ logs only
  warnings and errors (`TF_CPP_MIN_LOG_LEVEL=1`), and the first `import
  tensorflow` drops the known start-up lines (`NOISE`).
  """
  if "tensorflow" in sys.modules or _USER_LOG_LEVEL is not None:
    return
  set_log_level("1")
  if not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietTensorFlowImport())


def uninstall_quiet_import() -> None:
  """TensorFlow's next import shows everything it writes (`--verbose`)."""
  sys.meta_path[:] = [
    f for f in sys.meta_path if not isinstance(f, _QuietTensorFlowImport)
  ]


def start(verbose: bool) -> tuple[object, str]:
  """Imports TensorFlow (quietly unless `verbose`) and lists its devices.

  Only physical devices are listed, which does not start TensorFlow's
  runtime: logical CPUs can still be made afterwards.

  Returns:
    (the `tensorflow` module, a one-line description of the devices found).
  """
  uninstall_quiet_import()  # filtered here, where the lines are read
  context: contextlib.AbstractContextManager[list[str]] = (
    contextlib.nullcontext([]) if verbose else filtered_stderr()
  )
  with context as dropped:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    cpus = tf.config.list_physical_devices("CPU")
    gpus = tf.config.list_physical_devices("GPU")
  found = [f"{len(cpus)} CPU"] + [f"{len(gpus)} GPU" if gpus else "no GPU"]
  why = ""
  if not gpus and any("cuda" in line.lower() for line in dropped):
    why = " (no usable CUDA driver)"
  return tf, f"devices: {', '.join(found)}{why}"


def emit_first_use_notices() -> None:
  """Runs, quietly, the ops whose first use makes TensorFlow log a notice.

  oneDNN logs an error-level line the first time it transposes an int64
  tensor ("oneDNN supports DT_INT64 only on platforms with AVX-512.
  Falling back to the default Eigen-based implementation"; seen on a Xeon
  with AVX-512F too): once per process, mid-run (an iALS or two-tower
  run's evaluation), about a fallback that gives the same numbers. Call it
  after the runtime is configured (logical devices, threads): it runs an
  op.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  with filtered_stderr():
    try:
      with tf.device("/cpu:0"):
        tf.transpose(tf.zeros([1, 2], tf.int64))
    except tf.errors.OpError:  # no local CPU op here (a remote TPU's host):
      pass  # the notice may come later; the run must not fail for it
