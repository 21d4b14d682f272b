"""Where a recsys training process's resident memory goes, and what of it
TensorFlow's import leaves behind.

Issue 19 compares peak RSS with TorchRec's. This separates the part the
project allocates (anonymous pages) from the pages of the shared libraries
mapped into the process (file-backed, clean, shared with every process that
maps the same file, and reclaimable by the kernel at any time), and asks
how much of the latter a training run actually needs:

  keep      import, then train the default experiment (`recsys train
            --gin_file synthetic_dlrm.gin`, in this process)
  release   the same, but right after the imports the TensorFlow library
            mappings are paged out (madvise MADV_PAGEOUT, Linux >= 5.4), so
            that whatever training touches again is faulted back in: the
            difference is what only the import needed (static initializers
            of every registered op and kernel, symbol and relocation tables)

Each mode runs in its own fresh process. Per phase: RSS, its anonymous and
file parts, and the peak so far; after the imports, the libraries holding
the most resident pages; during training, the highest RSS sampled every
20 ms (the process's own peak is set by the import and hides it).

    python benchmarks/import_memory.py --steps 2000

MADV_PAGEOUT only reclaims pages no other process maps: run it while no
other TensorFlow process is alive, or the release phase shows no drop. This
is a measurement, not a feature: recsys does not page anything out.
"""

import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

MADV_PAGEOUT = 21


def status() -> dict[str, float]:
  """VmRSS / RssAnon / RssFile / VmHWM of this process, MiB."""
  out = {}
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      key = line.split(":")[0]
      if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
        out[key] = int(line.split()[1]) / 1024
  return out


def resident_by_file(top: int) -> list[tuple[str, float]]:
  """The mapped files (and [anon]) holding the most resident MiB."""
  totals: collections.Counter = collections.Counter()
  name = "[anon]"
  with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
    for line in f:
      fields = line.split()
      if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
        name = fields[5] if len(fields) > 5 else "[anon]"
      elif fields and fields[0] == "Rss:":
        totals[name] += int(fields[1]) / 1024
  return [(os.path.basename(k), v) for k, v in totals.most_common(top)]


def page_out_tensorflow() -> float:
  """Pages out the read-only TensorFlow library mappings; returns MiB
  advised."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
  advised = 0
  with open("/proc/self/maps", encoding="utf-8") as f:
    for line in f:
      fields = line.split()
      if len(fields) < 6 or "tensorflow" not in fields[5]:
        continue
      if "w" in fields[1]:  # relocated data: private, dirty, keep
        continue
      start, end = (int(x, 16) for x in fields[0].split("-"))
      if libc.madvise(start, end - start, MADV_PAGEOUT) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_PAGEOUT) failed")
      advised += end - start
  return advised / 2**20


class PeakSampler(threading.Thread):
  """Samples VmRSS every `interval` seconds; `peak` is the highest seen."""

  def __init__(self, interval: float = 0.02):
    super().__init__(daemon=True)
    self.interval = interval
    self.peak = 0.0
    self._stop_event = threading.Event()

  def run(self) -> None:
    while not self._stop_event.is_set():
      self.peak = max(self.peak, status()["VmRSS"])
      time.sleep(self.interval)

  def stop(self) -> float:
    self._stop_event.set()
    self.join()
    return self.peak


def child(mode: str, steps: int) -> None:
  phases = [("python started", status())]
  import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  phases.append(("import tensorflow", status()))
  from recsys import cli  # pylint: disable=g-import-not-at-top
  from recsys.training import trainer  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  phases.append(("import recsys training stack", status()))
  libraries = resident_by_file(8)
  if mode == "release":
    page_out_tensorflow()
    phases.append(("TF library pages released", status()))
  sampler = PeakSampler()
  sampler.start()
  with tempfile.TemporaryDirectory() as model_dir:
    code = cli.main(
      [
        "train",
        "--gin_file",
        "synthetic_dlrm.gin",
        "--model_dir",
        model_dir,
        "--gin_bindings",
        f"train.train_steps = {steps}",
      ]
    )
  training_peak = sampler.stop()
  if code != 0:
    raise SystemExit(f"recsys train exited with {code}")
  phases.append((f"trained {steps} steps", status()))
  print(
    json.dumps(
      {
        "mode": mode,
        "phases": phases,
        "libraries": libraries,
        "training_peak": training_peak,
      }
    )
  )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--modes", default="keep,release")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(args.child, args.steps)
    return
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  for mode in args.modes.split(","):
    out = subprocess.run(
      [sys.executable, __file__, "--child", mode, "--steps", str(args.steps)],
      env=env,
      check=True,
      capture_output=True,
      text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(f"\n## {mode}\n")
    print("| phase | RSS MiB | anonymous | file-backed | peak so far |")
    print("|---|---|---|---|---|")
    for phase, s in result["phases"]:
      print(
        f"| {phase} | {s['VmRSS']:.0f} | {s['RssAnon']:.0f} | "
        f"{s['RssFile']:.0f} | {s['VmHWM']:.0f} |"
      )
    print(
      f"\nhighest RSS sampled while training: {result['training_peak']:.0f}"
    )
    if mode == "keep":
      print("\nresident after the imports, by mapping (MiB):")
      for name, mib in result["libraries"]:
        print(f"  {mib:7.1f}  {name}")


if __name__ == "__main__":
  main()
