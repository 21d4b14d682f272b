"""Fuzz: hostile inputs and gradients through preprocess, lookup,
apply_gradients.

Random dense, ragged and sparse inputs — sparse ones unordered, with gapped,
repeated and negative columns, rows outside the batch, ids outside the
vocabulary — and activation gradients of the right or a wrong shape. Each
case must give the NumPy reference's activations and table update, or, where
the reference says the input is invalid, an error naming the feature (and
leave the tables as they were). FUZZ_SEED=<n> runs another draw.
"""

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from backends import (
  base,  # noqa: E402
  inputs,  # noqa: E402
)
from backends.tensorcore.backend import TensorCoreEmbedding  # noqa: E402

E = tf.tpu.experimental.embedding
V, D, W, L = 13, 3, 2, 3  # vocabulary, dim, bag width, sequence length
CASES = 120


class _Case:
  """One random input per feature, as (row, column, id) entries + its kind."""

  def __init__(self, rng, sequence):
    self.sequence = sequence
    self.batch = int(rng.integers(1, 5))
    self.kind = rng.choice(["dense1", "dense2", "ragged", "sparse", "sparse"])
    self.bad_reason = None
    if self.kind == "dense1":
      self.entries = [(r, 0, int(rng.integers(V))) for r in range(self.batch)]
    elif self.kind == "dense2":
      n = int(rng.integers(1, 5))
      self.entries = [
        (r, c, int(rng.integers(V)))
        for r in range(self.batch)
        for c in range(n)
      ]
      self.width = n
    elif self.kind == "ragged":
      self.entries = [
        (r, c, int(rng.integers(V)))
        for r in range(self.batch)
        for c in range(int(rng.integers(0, 5)))
      ]
    else:
      self.entries = []
      for r in range(self.batch):
        k = int(rng.integers(0, 5))
        if rng.random() < 0.5:  # gaps between columns
          cols = sorted(rng.choice(7, size=k, replace=False).tolist())
        else:
          cols = list(range(k))
        if cols and rng.random() < 0.1:  # a repeated column
          cols.append(cols[-1])
        self.entries += [(r, c, int(rng.integers(V))) for c in cols]
      if self.entries and rng.random() < 0.1:
        i = int(rng.integers(len(self.entries)))
        r, _, v = self.entries[i]
        self.entries[i] = (r, -1, v)
        self.bad_reason = "negative column"
      if self.entries and rng.random() < 0.1:
        i = int(rng.integers(len(self.entries)))
        _, c, v = self.entries[i]
        self.entries[i] = (self.batch if rng.random() < 0.5 else -1, c, v)
        self.bad_reason = "row outside"
      self.order = rng.permutation(len(self.entries))
      if rng.random() < 0.5:
        self.order = np.sort(self.order)
    if self.entries and rng.random() < 0.1:
      i = int(rng.integers(len(self.entries)))
      r, c, _ = self.entries[i]
      self.entries[i] = (r, c, V + 3 if rng.random() < 0.5 else -2)
    if not self.bad_reason and any(not 0 <= v < V for _, v, _ in self.uses()):
      self.bad_reason = "got id"  # ids that are cut are never read

  def tensor(self):
    ids = [v for _, _, v in self.entries]
    if self.kind == "dense1":
      return tf.constant(ids, tf.int64)
    if self.kind == "dense2":
      return tf.constant(ids, tf.int64, shape=[self.batch, self.width])
    if self.kind == "ragged":
      rows = [
        [v for r2, _, v in self.entries if r2 == r] for r in range(self.batch)
      ]
      return tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1)
    entries = [self.entries[i] for i in self.order]
    return tf.SparseTensor(
      tf.constant(
        [[r, c] for r, c, _ in entries], tf.int64, shape=[len(entries), 2]
      ),
      tf.constant([v for _, _, v in entries], tf.int64, shape=[len(entries)]),
      [self.batch, 7],
    )

  def uses(self):
    """The reference: (output index, id, d act / d row) of every kept id."""
    if self.sequence:
      return [((r, c), v, 1.0) for r, c, v in self.entries if c < L]
    out = []
    for r in range(self.batch):
      # Ids at one column keep the order the SparseTensor lists them in.
      shown = (
        np.argsort(self.order)
        if self.kind == "sparse"
        else range(len(self.entries))
      )
      row = sorted(
        [
          (c, shown[i], v)
          for i, (r2, c, v) in enumerate(self.entries)
          if r2 == r
        ]
      )[:W]
      out += [((r,), v, 1.0 / len(row)) for _, _, v in row]  # mean
    return out

  def preprocess_refuses(self):
    """Sparse sequences need ids at columns 0, 1, ... to be padded."""
    if not (self.sequence and self.kind == "sparse"):
      return False
    for r in range(self.batch):
      cols = sorted(c for r2, c, _ in self.entries if r2 == r)
      if any(c != rank for rank, c in enumerate(cols) if rank < L or c < L):
        return True
    return False

  def out_shape(self):
    return [self.batch, L, D] if self.sequence else [self.batch, D]


def _wrong(shape, rng):
  choices = [[shape[0] + 1] + shape[1:], shape[:-1] + [D + 1], shape + [1]]
  if shape[0] > 1:
    choices.append([shape[0] - 1] + shape[1:])
  if shape[::-1] != shape:
    choices.append(shape[::-1])
  return choices[int(rng.integers(len(choices)))]


def test_hostile_inputs_give_the_reference_or_an_error_naming_the_feature():
  rng = np.random.default_rng(
    int(__import__("os").environ.get("FUZZ_SEED", 15))
  )
  table0 = rng.normal(size=(V, D)).astype(np.float32)
  config = {
    "bag": E.FeatureConfig(E.TableConfig(V, D, name="bags", combiner="mean")),
    "seq": E.FeatureConfig(
      E.TableConfig(V, D, name="seqs"), max_sequence_length=L
    ),
  }
  backends = {
    static: TensorCoreEmbedding(
      config, E.SGD(1.0), bag_widths=W, static_shapes=static
    )
    for static in (False, True)
  }
  outcomes = {"ok": 0, "input error": 0, "gradient error": 0}
  for case_no in range(CASES):
    cases = {"bag": _Case(rng, False), "seq": _Case(rng, True)}
    while cases["seq"].batch != cases["bag"].batch:  # one batch per step
      cases["seq"] = _Case(rng, True)
    use_preprocess = rng.random() < 0.5
    emb = backends[bool(rng.random() < 0.5)]  # generic or static path
    tables = emb.embedding_tables
    for t in emb.tables:
      tables[t].assign(table0)
    features = {name: c.tensor() for name, c in cases.items()}
    bad = {name: c.bad_reason for name, c in cases.items() if c.bad_reason}
    if use_preprocess:
      bad.update(
        {
          name: "sequence"
          for name, c in cases.items()
          if name not in bad and c.preprocess_refuses()
        }
      )
    context = (
      f"case {case_no}: {[(n, c.kind, c.entries) for n, c in cases.items()]}"
    )
    try:
      if use_preprocess:
        features, _ = emb.preprocess(features)
      acts = emb.lookup(features, training=True)
    except (inputs.InvalidInputError, tf.errors.InvalidArgumentError) as e:
      assert bad, f"{context}: unexpected {e}"
      assert any(
        f"feature '{name}'" in str(e) or f"feature `{name}`" in str(e)
        for name in bad
      ), f"{context}: {e}"
      outcomes["input error"] += 1
      continue
    assert not bad, f"{context}: no error for {bad}"
    want_acts = {}
    for name, c in cases.items():
      want = np.zeros(c.out_shape(), np.float32)
      for index, v, scale in c.uses():
        want[index] += scale * table0[v]
      want_acts[name] = want
      np.testing.assert_allclose(
        acts[name].numpy(), want, rtol=1e-5, atol=1e-6, err_msg=context
      )
    grads = {
      name: rng.normal(size=c.out_shape()).astype(np.float32)
      for name, c in cases.items()
    }
    wrong = None
    if rng.random() < 0.3:
      wrong = str(rng.choice(list(cases)))
      grads[wrong] = np.ones(_wrong(list(grads[wrong].shape), rng), np.float32)
    before = {t.name: tables[t].numpy() for t in emb.tables}
    try:
      emb.apply_gradients({k: tf.constant(g) for k, g in grads.items()})
    except base.GradientShapeError as e:
      assert wrong is not None and f"feature {wrong!r}" in str(e), context
      for t in emb.tables:
        np.testing.assert_array_equal(tables[t].numpy(), before[t.name])
      outcomes["gradient error"] += 1
      continue
    assert wrong is None, f"{context}: a wrong gradient for {wrong} was applied"
    for name, c in cases.items():
      want = table0.copy()
      for index, v, scale in c.uses():
        want[v] -= scale * grads[name][index]
      table = next(t for t in emb.tables if t.name == config[name].table.name)
      np.testing.assert_allclose(
        tables[table].numpy(), want, rtol=1e-5, atol=1e-5, err_msg=context
      )
    outcomes["ok"] += 1
  # The generator reaches every outcome often enough to mean something.
  assert min(outcomes.values()) >= 10, outcomes
