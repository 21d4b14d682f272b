"""Peak resident memory of this process, phase by phase of a run.

A host's memory bounds the largest table it can train, and the peak can
come from any phase: building the tables, restoring a checkpoint, the
steps, saving, evaluating. Linux keeps a process's peak RSS (`VmHWM`) and
lets the process reset it to the current RSS (`/proc/self/clear_refs`), so
each phase's own peak is read at its end; the Trainer logs them when a run
ends. Elsewhere only the whole run's peak is known (`getrusage`).

Example:
  >>> peaks = PeakMemory()
  >>> with peaks.phase("save"):
  ...   manager.save()
  >>> peaks.describe()    # "save 1126 MiB"
"""

import contextlib
import resource
import sys
from collections.abc import Iterator

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _read_kib(field: str) -> int | None:
  """A `/proc/self/status` memory field in KiB, or None where there is none."""
  try:
    with open(_STATUS, encoding="ascii") as status:
      for line in status:
        if line.startswith(field + ":"):
          return int(line.split()[1])
  except OSError:
    return None
  return None


class PeakMemory:
  """Each phase's peak RSS of this process, in bytes (phases may repeat:
  the largest is kept)."""

  def __init__(self):
    self.peaks: dict[str, int] = {}
    self.resettable = _read_kib("VmHWM") is not None and self._reset()

  def _reset(self) -> bool:
    """Sets the peak to the current RSS; False where Linux does not allow."""
    try:
      with open(_CLEAR_REFS, "w", encoding="ascii") as clear:
        clear.write("5")
      return True
    except OSError:
      return False

  @staticmethod
  def _peak_bytes() -> int:
    hwm = _read_kib("VmHWM")
    if hwm is not None:
      return hwm << 10
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss << 10

  @contextlib.contextmanager
  def phase(self, name: str) -> Iterator[None]:
    """Records the peak RSS while the block runs as phase `name`'s."""
    if self.resettable:
      self._reset()
    try:
      yield
    finally:
      self.peaks[name] = max(self.peaks.get(name, 0), self._peak_bytes())

  def describe(self) -> str:
    """ "init 812.0 MiB, train 830.2 MiB, ..." in the phases' order."""
    parts = [f"{name} {b / 2**20:.0f} MiB" for name, b in self.peaks.items()]
    if not self.resettable:
      parts.append("(peaks since the process started: no per-phase reset)")
    return ", ".join(parts)
