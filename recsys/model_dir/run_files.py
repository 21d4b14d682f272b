"""Writes the files of a model dir without following symlinks.

A model dir may be shared, copied or prepared by someone else. Opened the
usual way, a `metrics.json` or `.recsys.lock` that is a symlink (or a hard
link) to another file made a run truncate and overwrite that file. Here:

* `write_text` refuses a symlink at the path, writes a temporary file next
  to it (created exclusively) and renames it over the path: the rename
  replaces the directory entry and never writes through it, and a reader
  never sees a half-written file.
* `open_lock_file` opens the lock with `O_NOFOLLOW` and refuses anything but
  a regular file with a single link.
* `remove_partial_checkpoint` deletes the shards a failed save left.

Example:
  >>> write_text(os.path.join(model_dir, "metrics.json"), json.dumps(metrics))
"""

import errno
import glob
import os
import shutil
import stat
import tempfile
from collections.abc import Sequence

from recsys.errors import RecsysError


class UnsafeRunFileError(RecsysError, OSError):
  """A model dir file is a symlink, a hard link or not a regular file."""


def _refuse_link(path: str) -> None:
  if os.path.islink(path):
    raise UnsafeRunFileError(
      f"{path} is a symbolic link (to {os.readlink(path)!r}); a run does not "
      "write through links in its model dir, as that would overwrite the "
      "file it points to. Remove the link, or use another --model_dir."
    )


def refuse_links(folder: str, names: Sequence[str]) -> None:
  """Refuses up front the files a run will write at its end, if links.

  Raises:
    UnsafeRunFileError: one of `folder/<name>` is a symbolic link.
  """
  for name in names:
    _refuse_link(os.path.join(folder, name))


def write_text(path: str, text: str) -> str:
  """Replaces the file `path` with `text`, never writing through a link.

  Raises:
    UnsafeRunFileError: `path` is a symbolic link.
  """
  _refuse_link(path)
  folder = os.path.dirname(path) or "."
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.unlink(tmp)
    except OSError:
      pass
    raise
  return path


def open_lock_file(path: str) -> int:
  """Opens (creating) a lock file for reading and writing; returns its fd.

  Raises:
    UnsafeRunFileError: `path` is a symbolic link, has other hard links, or
      is not a regular file.
  """
  try:
    fd = os.open(
      path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
    )
  except OSError as e:
    if e.errno == errno.ELOOP:
      _refuse_link(path)
    raise
  st = os.fstat(fd)
  if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
    os.close(fd)
    what = (
      "a hard link shared with another name"
      if stat.S_ISREG(st.st_mode)
      else "not a regular file"
    )
    raise UnsafeRunFileError(
      f"{path} is {what}; a run would overwrite what it shares. Remove it, "
      "or use another --model_dir."
    )
  return fd


def remove_partial_checkpoint(checkpoint_dir: str, step: int) -> None:
  """Deletes what a failed save of `ckpt-<step>` left (its `_temp` shards).

  TF writes a checkpoint's shards into `ckpt-<step>_temp*` and moves them
  into place at the end; a save that fails midway (disk full) leaves the
  folder behind, which only fills the disk further.
  """
  prefix = os.path.join(glob.escape(checkpoint_dir), f"ckpt-{step}_temp")
  for path in glob.glob(prefix + "*"):
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
