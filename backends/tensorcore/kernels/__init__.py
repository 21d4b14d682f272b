"""Fused CPU kernels for the tensorcore backend, built from this folder.

`embedding_ops.cc` holds TF ops (a de-duplicating bag lookup, or its bag sums
and de-duplication as two ops, the padded bags' flattening, the per-row
gradient reduction, an in-place SGD / Adagrad / lazy-Adam row update, the
last two also fused; split over the intra-op threads a step leaves idle;
a row-sharded table's all-to-all buckets and send buffer in one pass) that
replace the tensorcore step's chain of generic TF ops on the CPU with
the same math (docs/optimizers.md); `vocabulary_ops.cc` holds
`RecsysVocabularyUpdate`, a dynamic table's index update
(`backends.vocabulary.VocabularyIndex.update`) as one op on the index's own
state, with the same results. All `SOURCES` make one library, compiled against
the installed TensorFlow with the system C++ compiler, once per TF version and
set of sources:
`make` does it (`python -m backends.tensorcore.kernels`), and `load()` does it
on first use if nobody did. The library lands in `$RECSYS_KERNEL_DIR`, default
`~/.cache/recsys/kernels`.

Without a compiler, on another TF build, or with `RECSYS_FUSED_KERNELS=0`,
`load()` returns None (saying why once in the log) and the backend runs its
pure-TF ops, which give the same numbers up to float rounding.

Example:
  >>> from backends.tensorcore import kernels
  >>> ops = kernels.load()      # None: use the TF ops
"""

import fcntl
import hashlib
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any

from backends.errors import BackendError

log = logging.getLogger("recsys.backends")

#: The library's sources, compiled together (each one's text is in the
#: library's cache key: editing any makes a new library).
SOURCES = tuple(
  pathlib.Path(__file__).with_name(name)
  for name in ("embedding_ops.cc", "vocabulary_ops.cc")
)
#: The header the sources include (in the cache key as well).
HEADERS = tuple(
  pathlib.Path(__file__).with_name(name)
  for name in ("kernel_common.h", "id_table.h")
)
ENV_SWITCH = "RECSYS_FUSED_KERNELS"
ENV_DIR = "RECSYS_KERNEL_DIR"

_lock = threading.Lock()
_loaded: list[Any] = []  # [module or None] once load() has decided
_reason: list[str] = []  # why load() returned None


class KernelBuildError(BackendError, RuntimeError):
  """The compiler failed on the `SOURCES` (its output is in the message)."""


def enabled() -> bool:
  """False when `RECSYS_FUSED_KERNELS` is 0/false/off (use the TF ops)."""
  return os.environ.get(ENV_SWITCH, "1").strip().lower() not in (
    "0",
    "false",
    "off",
    "no",
  )


def _flags() -> list[str]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  # x86-64-v3 (AVX2, FMA) where the CPU has it: wide loads for the row loops.
  # Not -march=native: TF's Eigen headers fail on AVX512-FP16 with GCC 12.
  arch = ["-march=x86-64-v3"] if {"avx2", "fma"} <= _cpu_flags() else []
  # -ffp-contract=off: no fused multiply-add, each operation rounded as the
  # TF ops round it. -fno-math-errno: sqrt without the errno branch, so the
  # row loops vectorize (results unchanged). -fno-trapping-math: selects
  # between computed floats if-convert, so the float16 rounding's row loop
  # vectorizes (IEEE results unchanged; TF masks the traps anyway).
  return (
    [
      "-std=c++17",
      "-fPIC",
      "-O3",
      "-ffp-contract=off",
      "-fno-math-errno",
      "-fno-trapping-math",
      "-Wno-deprecated-declarations",
    ]
    + arch
    + tf.sysconfig.get_compile_flags()
  )


def _cpu_flags() -> set:
  """The CPU's feature flags from /proc/cpuinfo (empty where it is absent)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def library_path() -> pathlib.Path:
  """Where the library for this TF version, sources and flags is kept."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  key = hashlib.sha256()
  for source in SOURCES + HEADERS:
    key.update(source.name.encode())
    key.update(source.read_bytes())
  key.update(" ".join(_flags()).encode())
  key.update(tf.__version__.encode())
  folder = pathlib.Path(
    os.environ.get(ENV_DIR)
    or pathlib.Path.home() / ".cache" / "recsys" / "kernels"
  )
  return folder / f"recsys_ops-tf{tf.__version__}-{key.hexdigest()[:16]}.so"


def compiler() -> str | None:
  """The C++ compiler to use ($CXX, else g++ or c++ on PATH), or None."""
  for name in (os.environ.get("CXX"), "g++", "c++"):
    if name and shutil.which(name):
      return shutil.which(name)
  return None


def build(force: bool = False) -> pathlib.Path:
  """Compiles the `SOURCES` into `library_path()` (no-op if it exists).

  Safe to call from several processes at once: one compiles, under a file
  lock, into a temporary file renamed into place; the others wait for it.

  Raises:
    KernelBuildError: no compiler, or the compiler failed.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  target = library_path()
  if target.exists() and not force:
    return target
  cxx = compiler()
  if cxx is None:
    raise KernelBuildError(
      "no C++ compiler found (set CXX or install g++) to build "
      f"{_names()}; the tensorcore backend uses its TF ops meanwhile."
    )
  target.parent.mkdir(parents=True, exist_ok=True)
  with open(target.parent / ".build.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if target.exists() and not force:
      return target
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
      tmp = os.path.join(scratch, target.name)
      objects = [os.path.join(scratch, f"{s.stem}.o") for s in SOURCES]
      log.info(
        "compiling the fused CPU kernels (once per TensorFlow install; "
        "10-20 s on 2 cores): %s",
        " ".join([cxx, *_flags(), "-c", _names()]),
      )
      # One compiler per source, side by side (the larger one takes most of
      # the time), then one link.
      _run_compilers(
        [
          [cxx, *_flags(), "-c", str(source), "-o", obj]
          for source, obj in zip(SOURCES, objects)
        ]
      )
      _run_compilers(
        [[cxx, "-shared", *objects, "-o", tmp, *tf.sysconfig.get_link_flags()]]
      )
      os.replace(tmp, target)
  return target


def _run_compilers(commands: list[list[str]]) -> None:
  """Runs `commands` at once and waits for all; the first failure raises
  with its errors. None outlives this call (on any exception, the others
  are killed)."""
  procs = [
    subprocess.Popen(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for cmd in commands
  ]
  try:
    outputs = [proc.communicate() for proc in procs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  for proc, (_, stderr) in zip(procs, outputs):
    if proc.returncode != 0:
      errors = [x for x in stderr.splitlines() if "error" in x]
      raise KernelBuildError(
        f"compiling {_names()} failed (exit {proc.returncode}):\n"
        + "\n".join(errors[:20] or stderr.splitlines()[-20:])
      )


def _names() -> str:
  """The sources, for messages."""
  return ", ".join(str(source) for source in SOURCES)


def status() -> str:
  """One line for `recsys info`: whether training will use the kernels.

  Does not build or load anything.
  """
  if not enabled():
    return f"off ({ENV_SWITCH}=0): tensorcore uses its TF ops"
  path = library_path()
  if path.exists():
    return f"built, {path}"
  if compiler() is None:
    return "unavailable (no C++ compiler): tensorcore uses its TF ops"
  return (
    "not built yet: built on first use, or now with "
    "`python -m backends.tensorcore.kernels`"
  )


def load() -> Any | None:
  """The ops module (`recsys_bag_lookup`, ...), or None to use the TF ops.

  Builds the library first if needed. Decides once per process; says why in
  the log when it returns None, and logs each time it returns the kernels
  (a backend being built: its training log says which path it runs).
  """
  with _lock:
    if not _loaded:
      _decide()
  if _loaded[0] is not None:
    log.info(
      "tensorcore: training steps run the fused CPU kernels (%s); steps "
      "compiled by XLA run TF ops",
      library_path(),
    )
  return _loaded[0]


def _decide() -> None:
  """Loads the kernels once (building them if needed), or says why not."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  module, reason = None, ""
  if not enabled():
    reason = f"{ENV_SWITCH}=0"
  else:
    try:
      module = tf.load_op_library(str(build()))
      _register_gradients(tf, module)
    except (KernelBuildError, OSError, tf.errors.NotFoundError) as e:
      reason = str(e)
  if module is None:
    log.warning(
      "tensorcore: using TF ops, not the fused CPU kernels (%s)", reason
    )
    _reason.append(reason)
  _loaded.append(module)


def _register_gradients(tf, module) -> None:
  """A tape on the table sees the lookup as a gather of its unique rows.

  The gradient of `RecsysBagLookup` with respect to the table is
  `IndexedSlices(row_grads, unique_ids)`, as for `tf.gather` of the unique
  rows followed by a segment sum; none flows to ids or weights.
  """
  from backends import _tf_internal  # pylint: disable=g-import-not-at-top

  def table_gradient(op, grad, unique_ids, index):
    """[IndexedSlices of the unique rows, None for ids / segments / ...]."""
    row_grads = module.recsys_row_gradients(
      grads=tf.convert_to_tensor(grad),
      index=index,
      segments=op.inputs[2],
      scale=op.inputs[3],
      num_rows=tf.size(unique_ids, out_type=tf.int32),
    )
    shape = _tf_internal.variable_shape(op.inputs[0])
    return [tf.IndexedSlices(row_grads, unique_ids, shape)] + [None] * 4

  def bag_lookup_gradient(op, grad, *unused_int_grads):
    return table_gradient(op, grad, op.outputs[1], op.outputs[2])

  def bag_sums_gradient(op, grad):
    # The forward op checked the ids against the table's rows.
    unique_ids, index = module.recsys_bag_dedup(
      ids=op.inputs[1], num_rows=2**62
    )
    return table_gradient(op, grad, unique_ids, index)

  for op, register in (
    ("RecsysBagLookup", tf.RegisterGradient),
    ("RecsysBagSums", tf.RegisterGradient),
    ("RecsysBagDedup", None),
    ("RecsysBuckets", None),
    ("RecsysRowGradients", None),
    ("RecsysPaddedBags", None),
    ("RecsysSparseApply", None),
    ("RecsysBagApply", None),
    ("RecsysVocabularyUpdate", None),
  ):
    try:
      if register is None:
        tf.no_gradient(op)
      else:
        register(op)(
          bag_sums_gradient if op == "RecsysBagSums" else bag_lookup_gradient
        )
    except KeyError:  # registered already (a second load in this process)
      pass


def main(argv: list[str] | None = None) -> int:
  """`python -m backends.tensorcore.kernels [--force]`: build, load, print the
  path."""
  argv = sys.argv[1:] if argv is None else argv
  logging.basicConfig(level=logging.INFO, format="%(message)s")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  try:
    path = build(force="--force" in argv)
  except KernelBuildError as e:
    print(f"backends.tensorcore.kernels: {e}", file=sys.stderr)
    return 1
  if load() is None:
    print(
      f"backends.tensorcore.kernels: built {path} but could not load it: "
      f"{_reason[-1] if _reason else ''}",
      file=sys.stderr,
    )
    return 1
  print(path)
  return 0
