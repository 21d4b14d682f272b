"""Fingerprints of the files a run reads, and what changed in them since.

A run's data is part of the run: a resume, `recsys evaluate` or `recsys
export` over ratings that were replaced since training would silently
continue, score or serve another experiment. The trainer records a
fingerprint of every file its sources read (`DataSource.input_files()`)
with the run's configs (`run_dir.RunDir.write_input_files`), and the run
compares them before it goes on (`run_checks`).

A fingerprint is the file's size, modification time and SHA-256: of the
whole file up to `FULL_HASH_BYTES` (MovieLens' files, vocabularies: a few
milliseconds), else of its first and last `EDGE_BYTES` (Criteo's days are
tens of GiB). Content decides: a copied or touched file whose hash matches
is the same file; a large file whose size and edges match but whose
modification time changed is reported as a warning only (its middle was not
read).

Example:
  >>> before = fingerprints(["/data/ml-100k/u.data"])
  >>> changed_files(before, fingerprints(["/data/ml-100k/u.data"]))
  []
"""

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

#: Files up to this size are hashed whole.
FULL_HASH_BYTES = 64 << 20
#: Larger files: the SHA-256 of their first and last EDGE_BYTES.
EDGE_BYTES = 1 << 20
_BLOCK = 1 << 20

Fingerprint = dict[str, Any]


def _sha256(f, size: int) -> str:
  digest = hashlib.sha256()
  while size > 0:
    block = f.read(min(_BLOCK, size))
    if not block:
      break
    digest.update(block)
    size -= len(block)
  return digest.hexdigest()


def fingerprint(path: str) -> Fingerprint:
  """`{"size", "mtime", "sha256"}` of a file (or `"sha256_edges"` if large).

  Raises:
    OSError: the file cannot be read.
  """
  with open(path, "rb") as f:
    st = os.fstat(f.fileno())
    out: Fingerprint = {"size": st.st_size, "mtime": st.st_mtime}
    if st.st_size <= FULL_HASH_BYTES:
      out["sha256"] = _sha256(f, st.st_size)
    else:
      head = _sha256(f, EDGE_BYTES)
      f.seek(-EDGE_BYTES, os.SEEK_END)
      out["sha256_edges"] = f"{head}:{_sha256(f, EDGE_BYTES)}"
  return out


def fingerprints(paths: Iterable[str]) -> dict[str, Fingerprint]:
  """Absolute path -> `fingerprint`, for each distinct file of `paths`."""
  out = {}
  for path in paths:
    path = os.path.abspath(path)
    if path not in out:
      out[path] = fingerprint(path)
  return dict(sorted(out.items()))


def _content(fp: Mapping[str, Any]) -> tuple:
  return (fp.get("size"), fp.get("sha256"), fp.get("sha256_edges"))


def changed_files(
  old: Mapping[str, Fingerprint], new: Mapping[str, Fingerprint]
) -> list[str]:
  """What differs between the files a run read (`old`) and reads now.

  A file whose content moved to another path of the same name (a copied
  data folder) is the same file. Returns one line per change, naming the
  file; empty when the data is the same.
  """
  moved = {}
  for path, fp in new.items():
    if path not in old:
      moved[(os.path.basename(path), _content(fp))] = path
  lines = []
  for path, fp in old.items():
    if path not in new:
      twin = moved.pop((os.path.basename(path), _content(fp)), None)
      if twin is None:
        lines.append(f"{path}: read by the run, not read now")
      continue
    now = new[path]
    if fp.get("size") != now.get("size"):
      lines.append(
        f"{path}: {fp.get('size')} bytes when the run read it, "
        f"{now.get('size')} bytes now"
      )
    elif _content(fp) != _content(now):
      lines.append(
        f"{path}: same size ({now.get('size')} bytes), other content than "
        "when the run read it"
      )
  for path in moved.values():
    lines.append(f"{path}: read now, not read by the run")
  return lines


def unverified_files(
  old: Mapping[str, Fingerprint], new: Mapping[str, Fingerprint]
) -> list[str]:
  """Large files modified since the run whose size and edges still match
  (a warning: their middle was not hashed)."""
  return [
    path
    for path, fp in old.items()
    if path in new
    and "sha256_edges" in fp
    and _content(fp) == _content(new[path])
    and fp.get("mtime") != new[path].get("mtime")
  ]


__all__ = [
  "EDGE_BYTES",
  "FULL_HASH_BYTES",
  "changed_files",
  "fingerprint",
  "fingerprints",
  "unverified_files",
]
