"""One training run per model dir: an advisory lock held while training.

Two runs writing checkpoints into one directory would interleave them and
each would resume from the other's steps. `ModelDirLock` takes an exclusive
`fcntl.flock` on `<model_dir>/.recsys.lock` for as long as a run trains. The
kernel drops the lock when the process ends in any way (SIGKILL included), so
a crashed run never leaves a stale lock behind; the file only records who held
it last, for the error message.
"""

import datetime
import fcntl
import json
import os
import socket
import sys

from recsys.errors import RecsysError
from recsys.model_dir import run_files

LOCK_FILE = ".recsys.lock"


class ModelDirBusyError(RecsysError, RuntimeError):
  """Another live process is training in the same model dir."""


class ModelDirLock:
  """An exclusive, crash-safe lock on a model dir (a context manager).

  Args:
    model_dir: the run's directory (created if missing).
  """

  def __init__(self, model_dir: str):
    self.path = os.path.join(model_dir, LOCK_FILE)
    self._fd: int | None = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> "ModelDirLock":
    """Takes the lock without waiting.

    Raises:
      ModelDirBusyError: another process holds it; names that process.
      run_files.UnsafeRunFileError: the lock file is a symlink or hard link.
    """
    if self._fd is not None:
      return self
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    fd = run_files.open_lock_file(self.path)  # a symlink is refused
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(fd)
      os.close(fd)
      raise ModelDirBusyError(
        f"model dir {os.path.dirname(self.path)!r} is in use by another "
        f"training run ({holder}); two runs in one model dir would overwrite "
        "each other's checkpoints. Wait for it to finish, stop it, or use "
        "another --model_dir."
      ) from None
    record = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": datetime.datetime.now().isoformat(timespec="seconds"),
      "command": " ".join(sys.argv)[:500],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
    finally:
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "ModelDirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _read_holder(fd: int) -> str:
  try:
    record = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
  except (OSError, ValueError):
    return "holder unknown"
  if not record:
    return "holder unknown"
  return (
    f"pid {record.get('pid')} on {record.get('host')}, started "
    f"{record.get('started')}: {record.get('command', '')!r}"
  )
