"""Reads MovieLens files into NumPy: GroupLens ml-100k, ml-1m, RecBole atomic.

The files are small (at most a few million lines), so they are parsed once in
Python/NumPy; `recsys.data.movielens` builds the tf.data pipeline from the
resulting `RawMovieLens`. Layouts:

  ml-100k  u.data (user \\t item \\t rating \\t timestamp), u.item
           (pipe-separated, latin-1, 19 genre flags), u.user
           (id|age|gender|occupation|zip)
  ml-1m    ratings.dat (user::item::rating::timestamp), movies.dat
           (id::title::Genre|Genre, latin-1), users.dat
           (id::gender::age::occupation::zip)
  atomic   RecBole's <name>.inter / .user / .item: tab-separated with a typed
           header (`user_id:token  item_id:token  rating:float
           timestamp:float`); `token_seq` fields are space-separated (genres:
           field `genre` or `class`).
"""

import dataclasses
import glob
import io
import logging
import math
import os
import re
from collections.abc import Iterator, Sequence

import numpy as np

from recsys.data import text_files
from recsys.data.errors import DataFormatError, DatasetNotFoundError

log = logging.getLogger("recsys.data.movielens")

ML100K_GENRES = (
  "unknown",
  "Action",
  "Adventure",
  "Animation",
  "Children's",
  "Comedy",
  "Crime",
  "Documentary",
  "Drama",
  "Fantasy",
  "Film-Noir",
  "Horror",
  "Musical",
  "Mystery",
  "Romance",
  "Sci-Fi",
  "Thriller",
  "War",
  "Western",
)

URLS = {
  "ml-100k": "https://files.grouplens.org/datasets/movielens/ml-100k.zip",
  "ml-1m": "https://files.grouplens.org/datasets/movielens/ml-1m.zip",
}
REQUIRED = {
  "ml-100k": ("u.data", "u.item", "u.user"),
  "ml-1m": ("ratings.dat", "movies.dat", "users.dat"),
  "atomic": ("<name>.inter",),
}


@dataclasses.dataclass
class RatingOrigins:
  """Where each rating was read: its file and line (for error messages).

  Attributes:
    paths: the ratings files.
    file: `[N]` index into `paths` of each rating.
    line: `[N]` 1-based line number of each rating in its file.
  """

  paths: list[str]
  file: np.ndarray
  line: np.ndarray

  @classmethod
  def of_file(cls, path: str, lines: Sequence[int]) -> "RatingOrigins":
    return cls(
      [path], np.zeros(len(lines), np.int64), np.asarray(lines, np.int64)
    )

  def where(self, index: int) -> str:
    """`path:line` of rating `index`."""
    return f"{self.paths[int(self.file[index])]}:{int(self.line[index])}"

  @classmethod
  def joined(cls, parts: Sequence["RatingOrigins"]) -> "RatingOrigins":
    """The origins of ratings read from `parts` one after the other."""
    paths: list[str] = []
    files, lines = [], []
    for part in parts:
      files.append(part.file + len(paths))
      paths.extend(part.paths)
      lines.append(part.line)
    return cls(paths, np.concatenate(files), np.concatenate(lines))


@dataclasses.dataclass
class RawMovieLens:
  """Parsed files, raw ids as strings.

  Attributes:
    user, item: `[N]` raw ids of each rating (str arrays).
    rating: `[N]` float32.
    timestamp: `[N]` int64 seconds.
    users: raw user id -> {"age", "gender", "occupation", "zip"} (strings).
    items: raw item id -> list of genre names.
    source: the folder the files came from.
    item_info: raw item id -> {"title", "year"} (strings; the title without
      its "(year)" suffix, the release year or ""), where the files have them.
    origins: the file and line of each rating (None: not known).
    files: every file whose content went into these arrays.
  """

  user: np.ndarray
  item: np.ndarray
  rating: np.ndarray
  timestamp: np.ndarray
  users: dict[str, dict[str, str]]
  items: dict[str, list[str]]
  source: str
  item_info: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
  origins: RatingOrigins | None = None
  files: list[str] = dataclasses.field(default_factory=list)


_TITLE_YEAR = re.compile(r"\s*\((\d{4})\)\s*$")
_ANY_YEAR = re.compile(r"(1[89]\d\d|20\d\d)")


def title_and_year(title: str, date: str = "") -> dict[str, str]:
  """{"title", "year"} from a GroupLens title "Name (1995)" and release date.

  The year is the title's "(yyyy)" suffix, else the last four-digit year in
  `date` (ml-100k's "01-Jan-1995"), else "".
  """
  match = _TITLE_YEAR.search(title)
  year = match.group(1) if match else ""
  if not year:
    found = _ANY_YEAR.findall(date)
    year = found[-1] if found else ""
  return {"title": _TITLE_YEAR.sub("", title).strip(), "year": year}


def missing_message(variant: str, data_dir: str, problem: str) -> str:
  """The 'what to put where' message for a missing or incomplete folder."""
  files = ", ".join(REQUIRED[variant])
  if variant == "atomic":
    put = (
      "put RecBole atomic files (e.g. ml-100k.inter, ml-100k.user, "
      "ml-100k.item, as in the recbole wheel's "
      f"recbole/dataset_example/ml-100k/) in {data_dir!r}"
    )
  else:
    put = (
      f"put the GroupLens files {files} in {data_dir!r} (unzip "
      f"{URLS[variant]}), or let recsys fetch them there on a machine that "
      "is online: --gin_bindings 'MovieLens.download = True' (download=True "
      "in Python)"
    )
  if not os.path.isabs(data_dir):
    problem += f" (cwd: {os.getcwd()})"
  return f"MovieLens {variant}: {problem}; {put}."


def _lines(path: str, encoding: str) -> list[str]:
  """The file's lines; DataFormatError naming file and line if one is bad.

  A UTF-8 byte-order mark is cut (`text_files`) and says the file is UTF-8:
  an editor that saved a latin-1 file "as UTF-8 with BOM" converted it.
  """
  with open(path, "rb") as f:
    raw = f.read()
  raw, marked = text_files.without_bom(raw, path)
  if marked:
    encoding = "utf-8"
  try:
    text = raw.decode(encoding)
  except UnicodeDecodeError as e:
    line_no = raw.count(b"\n", 0, e.start) + 1
    why = " (it starts with a UTF-8 byte-order mark)" if marked else ""
    raise DataFormatError(
      f"{path}:{line_no}: not valid {encoding} text{why} ({e.reason} at "
      f"byte {e.start + len(text_files.UTF8_BOM) * marked} of the file); "
      "re-extract the "
      f"dataset or convert the file to {encoding}."
    ) from e
  return [line.rstrip("\r\n") for line in io.StringIO(text, newline="")]


def _fields(
  path: str, line_no: int, line: str, sep: str, expected: int
) -> list[str]:
  parts = line.split(sep)
  if len(parts) < expected:
    raise DataFormatError(
      f"{path}:{line_no}: expected {expected} {sep!r}-separated fields, got "
      f"{len(parts)}: {line[:200]!r}"
    )
  return parts


def _rows(
  path: str, sep: str, expected: int, encoding: str = "latin-1"
) -> Iterator[tuple[int, list[str]]]:
  """`(line number, fields)` of each non-blank line (DataFormatError: short)."""
  for n, line in enumerate(_lines(path, encoding), start=1):
    if line.strip():
      yield n, _fields(path, n, line, sep, expected)


def read_ratings(
  path: str, sep: str, encoding: str = "latin-1"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, RatingOrigins]:
  """`(users, items, ratings, timestamps, origins)` of a GroupLens ratings file.

  Shared with `split_files`, which reads ml-100k's fold files
  (`u1.base`, ...) in u.data's layout.

  Raises:
    DataFormatError: a line is short, or its rating or timestamp is not a
      finite number (names file and line).
  """
  users, items, ratings, stamps, lines = [], [], [], [], []
  for n, parts in _rows(path, sep, 4, encoding):
    lines.append(n)
    u, i, r, t = parts[:4]
    try:
      ratings.append(_finite(float(r)))
      stamps.append(_timestamp(t))
    except (ValueError, OverflowError) as e:
      raise DataFormatError(
        f"{path}:{n}: rating and timestamp must be finite numbers, "
        f"got {r!r} and {t!r} ({e})"
      ) from e
    users.append(u.strip())
    items.append(i.strip())
  return (
    np.array(users, dtype=object),
    np.array(items, dtype=object),
    np.array(ratings, np.float32),
    np.array(stamps, np.int64),
    RatingOrigins.of_file(path, lines),
  )


_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT64 = np.iinfo(np.int64)


def _finite(value: float) -> float:
  """A rating that stays finite as the float32 label it becomes (1e39: inf)."""
  if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
    raise ValueError(f"{value} is not a finite float32")
  return value


def _timestamp(text: str) -> int:
  """A timestamp in seconds that fits int64 (1e30 overflowed the array)."""
  value = int(float(text))
  if not _INT64.min <= value <= _INT64.max:
    raise ValueError(f"{text.strip()} does not fit a 64-bit integer")
  return value


def _required_rows(
  path: str, sep: str, expected: int, what: str
) -> Iterator[tuple[int, list[str]]]:
  """`_rows` of a file that must hold a row (DataFormatError if empty)."""
  empty = True
  for n, parts in _rows(path, sep, expected):
    empty = False
    yield n, parts
  if empty:
    raise DataFormatError(
      f"{path}: no {what} (the file is empty or blank); a complete download "
      "has one per line. Re-extract the dataset's zip."
    )


def _users(
  path: str, sep: str, columns: Sequence[str]
) -> dict[str, dict[str, str]]:
  """User id -> {"age", "gender", "occupation", "zip"} of a GroupLens user file.

  `columns` names the file's first five fields in order ("id" for the user id).
  """
  users = {}
  for _, parts in _required_rows(path, sep, 5, "users"):
    user = dict(zip(columns, parts))
    users[user["id"]] = {
      key: user[key] for key in ("age", "gender", "occupation", "zip")
    }
  return users


def read_100k(folder: str, ratings_file: str | None = "u.data") -> RawMovieLens:
  """ml-100k's ratings (None: none, the metadata only) and metadata.

  `split_files` reads the metadata this way and each fold file
  with `read_ratings`.
  """
  if ratings_file is None:
    empty = np.zeros(0, dtype=object)
    user, item, rating, ts, origins = (
      empty,
      empty,
      np.zeros(0, np.float32),
      np.zeros(0, np.int64),
      None,
    )
  else:
    user, item, rating, ts, origins = read_ratings(
      os.path.join(folder, ratings_file), "\t"
    )
  users = _users(
    os.path.join(folder, "u.user"),
    "|",
    ("id", "age", "gender", "occupation", "zip"),
  )
  items, info = {}, {}
  for _, parts in _required_rows(
    os.path.join(folder, "u.item"), "|", 5 + len(ML100K_GENRES), "movies"
  ):
    flags = parts[-len(ML100K_GENRES) :]
    items[parts[0]] = [
      g for g, flag in zip(ML100K_GENRES, flags) if flag.strip() == "1"
    ]
    info[parts[0]] = title_and_year(parts[1], parts[2])
  read = [ratings_file] if ratings_file else []
  files = [os.path.join(folder, f) for f in read + ["u.user", "u.item"]]
  return RawMovieLens(
    user, item, rating, ts, users, items, folder, info, origins, files
  )


def _read_1m(folder: str) -> RawMovieLens:
  user, item, rating, ts, origins = read_ratings(
    os.path.join(folder, "ratings.dat"), "::"
  )
  users = _users(
    os.path.join(folder, "users.dat"),
    "::",
    ("id", "gender", "age", "occupation", "zip"),
  )
  items, info = {}, {}
  for _, parts in _required_rows(
    os.path.join(folder, "movies.dat"), "::", 3, "movies"
  ):
    items[parts[0]] = [g for g in parts[-1].split("|") if g]
    info[parts[0]] = title_and_year("::".join(parts[1:-1]))
  files = [
    os.path.join(folder, f) for f in ("ratings.dat", "users.dat", "movies.dat")
  ]
  return RawMovieLens(
    user, item, rating, ts, users, items, folder, info, origins, files
  )


def _atomic_table(path: str) -> tuple[list[str], list[list[str]]]:
  """(field names without types, rows) of a RecBole atomic file."""
  names, rows, _ = _atomic_table_lines(path)
  return names, rows


def _atomic_table_lines(
  path: str,
) -> tuple[list[str], list[list[str]], list[int]]:
  """`_atomic_table` and the line number of each row."""
  lines = _lines(path, "utf-8")
  if not lines:
    raise DataFormatError(
      f"{path}:1: empty file; expected a header like "
      "'user_id:token\\titem_id:token\\trating:float\\ttimestamp:float'."
    )
  header = lines[0].split("\t")
  names = []
  for field in header:
    if ":" not in field:
      raise DataFormatError(
        f"{path}:1: header field {field!r} has no ':type' (RecBole "
        "atomic headers look like 'user_id:token')."
      )
    names.append(field.rsplit(":", 1)[0])
  rows, numbers = [], []
  for n, line in enumerate(lines[1:], start=2):
    if not line.strip():
      continue
    parts = line.split("\t")
    if len(parts) != len(names):
      raise DataFormatError(
        f"{path}:{n}: expected {len(names)} tab-separated fields "
        f"({', '.join(header)}), got {len(parts)}: {line[:200]!r}"
      )
    rows.append(parts)
    numbers.append(n)
  return names, rows, numbers


def _column(
  path: str, names: list[str], candidates: Sequence[str], required: bool = True
) -> int | None:
  for name in candidates:
    if name in names:
      return names.index(name)
  if required:
    raise DataFormatError(
      f"{path}:1: no field named {' or '.join(candidates)} in header {names}."
    )
  return None


def _required_column(path: str, names: list[str], candidates: list[str]) -> int:
  """Like `_column(..., required=True)`, typed as always an index."""
  column = _column(path, names, candidates)
  if column is None:  # _column raised already; for the type checker
    raise DataFormatError(f"{path}:1: no field {candidates} in {names}.")
  return column


def read_atomic(folder: str, name: str | None) -> RawMovieLens:
  """RecBole's `<name>.inter` (None: the one `*.inter`) with its metadata.

  `split_files` reads `<name>.train` and `<name>.test` this way.

  Raises:
    DatasetNotFoundError: no such file, or not exactly one `*.inter`.
    DataFormatError: a row does not parse (names file and line).
  """
  if name is None:
    inters = sorted(glob.glob(os.path.join(folder, "*.inter")))
    if len(inters) != 1:
      raise DatasetNotFoundError(
        missing_message(
          "atomic",
          folder,
          f"expected exactly one *.inter file, found {len(inters)} "
          "(pass dataset_name= to choose)",
        )
      )
    name = os.path.basename(inters[0])[: -len(".inter")]
  path = os.path.join(folder, f"{name}.inter")
  if not os.path.exists(path):
    raise DatasetNotFoundError(
      missing_message("atomic", folder, f"{name}.inter is missing")
    )
  names, rows, numbers = _atomic_table_lines(path)
  cu = _required_column(path, names, ["user_id"])
  ci = _required_column(path, names, ["item_id"])
  cr = _column(path, names, ["rating"], required=False)
  ct = _column(path, names, ["timestamp"], required=False)
  ratings: list[float] = []
  stamps: list[int] = []
  for i, r in enumerate(rows):
    try:
      ratings.append(_finite(float(r[cr])) if cr is not None else 1.0)
      stamps.append(_timestamp(r[ct]) if ct is not None else 0)
    except (ValueError, OverflowError) as e:
      raise DataFormatError(
        f"{path}:{numbers[i]}: rating and timestamp fields must be "
        "finite numbers, got "
        f"{r[cr] if cr is not None else None!r} and "
        f"{r[ct] if ct is not None else None!r} ({e})"
      ) from e
  rating = np.array(ratings, np.float32)
  ts = np.array(stamps, np.int64)
  user = np.array([r[cu] for r in rows], dtype=np.object_)
  item = np.array([r[ci] for r in rows], dtype=np.object_)
  users, items = atomic_metadata(folder, name)
  info = atomic_item_info(folder, name)
  return RawMovieLens(
    user,
    item,
    rating,
    ts,
    users,
    items,
    folder,
    info,
    RatingOrigins.of_file(path, numbers),
    [path] + atomic_metadata_files(folder, name),
  )


def atomic_metadata_files(folder: str, name: str) -> list[str]:
  """RecBole's optional `<name>.user` / `<name>.item` files that exist."""
  paths = [os.path.join(folder, f"{name}.{kind}") for kind in ("user", "item")]
  return [p for p in paths if os.path.exists(p)]


def atomic_metadata(
  folder: str, name: str
) -> tuple[dict[str, dict[str, str]], dict[str, list[str]]]:
  """(users, items) from RecBole's optional `<name>.user` / `<name>.item`."""
  users = {}
  upath = os.path.join(folder, f"{name}.user")
  if os.path.exists(upath):
    unames, urows = _atomic_table(upath)
    cols = {
      key: _column(upath, unames, cands, required=False)
      for key, cands in (
        ("age", ["age"]),
        ("gender", ["gender"]),
        ("occupation", ["occupation"]),
        ("zip", ["zip_code", "zip"]),
      )
    }
    uid = _required_column(upath, unames, ["user_id"])
    for r in urows:
      users[r[uid]] = {
        k: (r[c] if c is not None else "") for k, c in cols.items()
      }
  items = {}
  ipath = os.path.join(folder, f"{name}.item")
  if os.path.exists(ipath):
    inames, irows = _atomic_table(ipath)
    iid = _required_column(ipath, inames, ["item_id"])
    cg = _column(ipath, inames, ["genre", "class", "genres"], required=False)
    for r in irows:
      items[r[iid]] = r[cg].split() if cg is not None else []
  return users, items


def atomic_item_info(folder: str, name: str) -> dict[str, dict[str, str]]:
  """Item id -> {"title", "year"} from RecBole's optional `<name>.item` file."""
  ipath = os.path.join(folder, f"{name}.item")
  if not os.path.exists(ipath):
    return {}
  inames, irows = _atomic_table(ipath)
  iid = _required_column(ipath, inames, ["item_id"])
  ct = _column(ipath, inames, ["movie_title", "title"], required=False)
  cy = _column(ipath, inames, ["release_year", "year"], required=False)
  info = {}
  for r in irows:
    title = r[ct] if ct is not None else ""
    year = r[cy].strip() if cy is not None else ""
    info[r[iid]] = title_and_year(title, year)
  return info


def _has(folder: str, variant: str, name: str | None) -> bool:
  if variant == "atomic":
    pattern = f"{name}.inter" if name else "*.inter"
    return bool(glob.glob(os.path.join(folder, pattern)))
  return all(os.path.exists(os.path.join(folder, f)) for f in REQUIRED[variant])


def find_folder(
  data_dir: str, variant: str, name: str | None = None
) -> str | None:
  """`data_dir` or `data_dir/<variant or name>` if it holds the files."""
  for folder in (data_dir, os.path.join(data_dir, name or variant)):
    if os.path.isdir(folder) and _has(folder, variant, name):
      return folder
  return None


def detect_variant(data_dir: str, name: str | None = None) -> str | None:
  """The layout of the files in `data_dir` (or its `<variant>/` subfolder).

  RecBole's `*.inter` files mean "atomic" (checked first), `u.data` & co.
  "ml-100k", `ratings.dat` & co. "ml-1m"; None if none is there.
  """
  for variant in ("atomic", "ml-100k", "ml-1m"):
    if find_folder(data_dir, variant, name if variant == "atomic" else None):
      return variant
  return None


def download(data_dir: str, variant: str) -> None:
  """Downloads and unzips a GroupLens variant into `data_dir/<variant>/`.

  Raises:
    DatasetNotFoundError: offline, or the download failed.
  """
  from recsys._keras import keras  # pylint: disable=g-import-not-at-top

  if variant not in URLS:
    raise DatasetNotFoundError(
      missing_message(
        variant, data_dir, f"there is no download for the {variant} layout"
      )
    )
  try:
    os.makedirs(data_dir, exist_ok=True)
    keras.utils.get_file(
      f"{variant}.zip",
      URLS[variant],
      cache_dir=os.path.abspath(data_dir),
      cache_subdir=".",
      extract=True,
    )
  except Exception as e:  # noqa: BLE001 - any network/IO failure means "fill the folder"
    raise DatasetNotFoundError(
      missing_message(
        variant,
        data_dir,
        f"download from {URLS[variant]} failed ({type(e).__name__}: {e})",
      )
    ) from e


def read(
  data_dir: str,
  variant: str,
  name: str | None = None,
  allow_download: bool = False,
) -> RawMovieLens:
  """Reads a MovieLens folder.

  Args:
    data_dir: folder holding the files (or a `<variant>/` subfolder with them).
    variant: "ml-100k", "ml-1m" or "atomic".
    name: for "atomic", the file stem (`<name>.inter`); None: the only *.inter.
    allow_download: download GroupLens variants that are missing.

  Returns:
    The parsed `RawMovieLens`.

  Raises:
    DatasetNotFoundError: the folder or its files are missing (not downloaded).
    DataFormatError: a file does not parse (or a required one is empty, or a
      rating is not finite); the message names file and line. Ratings of users
      or movies missing from the metadata files are logged with their count.
  """
  if variant not in REQUIRED:
    raise ValueError(
      f"unknown MovieLens variant {variant!r}; valid: {', '.join(REQUIRED)}."
    )
  folder = find_folder(data_dir, variant, name)
  if folder is None and allow_download and variant in URLS:
    download(data_dir, variant)
    folder = find_folder(data_dir, variant, name)
  if folder is None:
    if os.path.isfile(data_dir):
      problem = (
        f"{data_dir!r} is a file; data_dir must be the folder that holds "
        "the files"
      )
    elif not os.path.isdir(data_dir):
      problem = f"folder {data_dir!r} does not exist"
    else:
      problem = f"the files are not in {data_dir!r}"
    raise DatasetNotFoundError(missing_message(variant, data_dir, problem))
  if variant == "ml-100k":
    raw, ratings_file = read_100k(folder), "u.data"
  elif variant == "ml-1m":
    raw, ratings_file = _read_1m(folder), "ratings.dat"
  else:
    raw = read_atomic(folder, name)
    inter = glob.glob(os.path.join(folder, f"{name or '*'}.inter"))[0]
    ratings_file = os.path.basename(inter)
  check_ratings(raw, os.path.join(folder, ratings_file))
  return raw


#: The rating scale each layout declares: GroupLens' READMEs of ml-100k and
#: ml-1m ("1-5", whole stars); RecBole's atomic MovieLens files also hold
#: the later releases' half stars (ml-10m, ml-20m: 0.5-5).
RATING_SCALES = {
  "ml-100k": (1.0, 5.0),
  "ml-1m": (1.0, 5.0),
  "atomic": (0.5, 5.0),
}


def check_rating_scale(
  raw: RawMovieLens, scale: tuple[float, float], what: str
) -> None:
  """Every rating lies in `scale` (inclusive).

  Args:
    raw: the ratings read.
    scale: `(lowest, highest)` rating the dataset declares.
    what: the dataset, for the message (e.g. "ml-100k").

  Raises:
    DataFormatError: a rating is outside the scale; names the file and line
      of the first one and counts them all.
  """
  low, high = scale
  bad = np.flatnonzero((raw.rating < low) | (raw.rating > high))
  if not bad.size:
    return
  first = int(bad[0])
  where = raw.origins.where(first) if raw.origins is not None else raw.source
  raise DataFormatError(
    f"{where}: rating {float(raw.rating[first]):g} is outside the {what} "
    f"rating scale [{low:g}, {high:g}] ({bad.size} rating(s) are; this is "
    "the first). A rating off the scale trains the model on a label it can "
    "never be asked for and skews the rating-weighted histories. Fix or "
    "remove the line(s), or for a dataset with another scale set "
    "MovieLens.rating_scale = (lowest, highest) (None: no check)."
  )


def check_ratings(raw: RawMovieLens, path: str) -> None:
  """No ratings is an error; ratings of users/movies without metadata counted.

  Every reader of a ratings file runs it (`read`, `split_files`).

  Raises:
    DataFormatError: the ratings file has no rating.
  """
  if raw.rating.size == 0:
    raise DataFormatError(
      f"{path}: no ratings (the file is empty, blank or only a header); "
      "expected "
      "one 'user, item, rating, timestamp' row per line."
    )
  for what, ids, known in (
    ("users", raw.user, raw.users),
    ("movies", raw.item, raw.items),
  ):
    if not known:  # optional metadata files (RecBole) may be absent
      continue
    missing = sorted({i for i in ids if i not in known})
    if missing:
      log.warning(
        "%s: %d rated %s have no metadata (e.g. %s); their %s features "
        "are id 0 (unknown).",
        path,
        len(missing),
        what,
        missing[:5],
        "user" if what == "users" else "genre",
      )
