"""Byte-order marks at the start of text data files: stripped or refused.

Editors and spreadsheets that save "UTF-8 with BOM" put the three bytes
EF BB BF before a file's first line. Read as text they were glued to its
first field: MovieLens' first rating was a phantom user '\\ufeff196' (user
196 lost it), the first user and movie of `u.user` / `u.item` lost their
side features, a Criteo file's first label was not 0 or 1, a vocabulary
file's first value was never matched. Every reader of a text data file
strips the mark here: Python readers with `without_bom` on the file's
bytes, tf.data line readers with `first_line_without_bom` on each file's
first line. A UTF-16 or UTF-32 mark means the whole file is in another
encoding, which no reader can take line by line: it is refused, naming the
file.

Example:
  >>> data, had_bom = without_bom(open(path, "rb").read(), path)
  >>> lines = first_line_without_bom(lines, first_line == 0)  # in tf.data
"""

import tensorflow as tf

from recsys.data.errors import DataFormatError

#: The UTF-8 byte-order mark.
UTF8_BOM = b"\xef\xbb\xbf"
#: Marks of encodings the readers do not take (UTF-32 LE starts like UTF-16
#: LE, so its mark is listed first).
_OTHER_BOMS = (
  (b"\xff\xfe\x00\x00", "UTF-32"),
  (b"\x00\x00\xfe\xff", "UTF-32"),
  (b"\xff\xfe", "UTF-16"),
  (b"\xfe\xff", "UTF-16"),
)


def check_encoding_mark(head: bytes, path: str) -> None:
  """Refuses a file whose first bytes `head` are a UTF-16/32 mark.

  Raises:
    DataFormatError: names the file and its encoding.
  """
  for mark, encoding in _OTHER_BOMS:
    if head.startswith(mark):
      raise DataFormatError(
        f"{path}: the file starts with a {encoding} byte-order mark "
        f"({mark.hex()}): it is {encoding} text, which recsys does not "
        "read. Save it as UTF-8 (or the dataset's own encoding), e.g. "
        f"`iconv -f {encoding} -t UTF-8`."
      )


def without_bom(data: bytes, path: str) -> tuple[bytes, bool]:
  """`data` (a file's bytes) without a leading UTF-8 mark; whether it had one.

  Raises:
    DataFormatError: `data` starts with a UTF-16 or UTF-32 mark.
  """
  if data.startswith(UTF8_BOM):
    return data[len(UTF8_BOM) :], True
  check_encoding_mark(data[:4], path)
  return data, False


def first_line_without_bom(lines: tf.Tensor, first: tf.Tensor) -> tf.Tensor:
  """`lines` (string `[n]`, n >= 1) with a UTF-8 mark cut from `lines[0]`
  where `first` (bool scalar: the chunk starts the file)."""
  size = len(UTF8_BOM)
  head = lines[0]
  marked = tf.logical_and(
    first, tf.equal(tf.strings.substr(head, 0, size), UTF8_BOM)
  )
  length = tf.strings.length(head)
  cut = tf.minimum(length, size)  # a line shorter than the mark has none
  rest = tf.strings.substr(head, cut, length - cut)
  head = tf.where(marked, rest, head)
  return tf.concat([head[tf.newaxis], lines[1:]], 0)


__all__ = [
  "UTF8_BOM",
  "check_encoding_mark",
  "first_line_without_bom",
  "without_bom",
]
