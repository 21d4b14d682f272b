"""Replaces a directory with a freshly written one in a single step.

`recsys export` writes a SavedModel of several files (graph, variable data,
variable index). Written in place, a kill midway leaves a mixture that does
not load (new data file, old index) and the good export it replaced is gone.
Here the new directory is written as a hidden sibling (same filesystem) and
swapped in whole: Linux's `renameat2(RENAME_EXCHANGE)` exchanges the two
names atomically, so at every instant `target` is either the old directory
or the new one. Where the exchange is unavailable, the old directory is
renamed aside first (a kill between the two renames leaves it, whole, at
`<target>.old-<pid>`, and the error or log names it).

Example:
  >>> with replaced_atomically("/srv/export") as tmp:
  ...   tf.saved_model.save(module, tmp)      # /srv/export is untouched here
"""

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

from recsys.errors import RecsysError

log = logging.getLogger("recsys")

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class UnsafeReplaceError(RecsysError, OSError):
  """The target holds something that replacing it would destroy."""


def _load_renameat2() -> Callable[..., int] | None:
  try:
    libc = ctypes.CDLL(
      ctypes.util.find_library("c") or "libc.so.6", use_errno=True
    )
    fn = libc.renameat2
  except (OSError, AttributeError):
    return None
  fn.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_uint,
  ]
  fn.restype = ctypes.c_int
  return fn


def exchange(a: str, b: str) -> bool:
  """Atomically swaps the names `a` and `b`; False if the OS cannot."""
  fn = _load_renameat2()
  if fn is None:
    return False
  if (
    fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    == 0
  ):
    return True
  err = ctypes.get_errno()
  if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
    return False  # old kernel or a filesystem without exchange
  raise OSError(err, f"cannot exchange {a!r} and {b!r}: {os.strerror(err)}")


def _fsync_dir(path: str) -> None:
  try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


@contextlib.contextmanager
def replaced_atomically(
  target: str, *, may_replace: Callable[[str], bool] = lambda _: True
) -> Iterator[str]:
  """Yields a temporary sibling to write into, then swaps it in as `target`.

  Args:
    target: the directory to create or replace.
    may_replace: called with an existing, non-empty `target`; False refuses
      to replace it (e.g. it is not the kind of directory being written).

  Yields:
    The temporary directory (empty). If the body raises, it is removed and
    `target` is untouched.

  Raises:
    UnsafeReplaceError: `target` exists and is not a directory, or
      `may_replace` refused it.
  """
  target = os.path.abspath(target)
  parent, name = os.path.split(target)
  if os.path.lexists(target):
    if os.path.islink(target) or not os.path.isdir(target):
      raise UnsafeReplaceError(
        f"{target!r} exists and is not a directory; remove it or choose "
        "another path."
      )
    if os.listdir(target) and not may_replace(target):
      raise UnsafeReplaceError(
        f"{target!r} is not empty and does not hold what would replace it; "
        "it is left as it is. Choose an empty or new directory."
      )
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)  # as os.makedirs would (mkdtemp gives 0700)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  _fsync_dir(tmp)
  if not os.path.lexists(target):
    os.rename(tmp, target)
  elif exchange(tmp, target):  # tmp now holds the old directory
    shutil.rmtree(tmp, ignore_errors=True)
  else:
    aside = f"{target}.old-{os.getpid()}"
    os.rename(target, aside)
    log.info(
      "replacing %s; the previous one is at %s until the new one is in place",
      target,
      aside,
    )
    os.rename(tmp, target)
    shutil.rmtree(aside, ignore_errors=True)
  _fsync_dir(parent)
