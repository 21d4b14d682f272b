"""The backend conformance suite: every declared capability against NumPy.

A backend declares what it supports in its `capabilities`
(`backends.base.Capabilities`: combiners, optimizers, input kinds, sequence
features, whether it trains). This suite turns each declaration into checks:
what a backend declares it supports must give the numbers of a NumPy
reference; what it does not declare it must refuse with a named error
(`UnsupportedConfigError` / `UnsupportedInputError` naming the table or
feature and the feature asked for, `NotImplementedError` for training a
lookup-only backend). Checks, by name (`check_names()`):

  lookup/<kind>[-weighted]  dense, sparse, ragged ids (weights on sparse and
                            ragged), every declared combiner, two features
                            sharing a table, an empty bag, repeated ids.
  combiner/<c>              sum, mean, sqrtn: accepted, or refused naming
                            the table and the combiner.
  sequence                  a `max_sequence_length` feature: `[B, L, D]`
                            (padded, truncated), or refused naming it.
  optimizer/<case>          two training steps of each optimizer (and of
                            clipping, weight decay, dense Adam, FTRL's
                            options) against `backends.reference_optimizers`
                            (docs/optimizers.md), tables and slots; refused
                            if undeclared; `NotImplementedError` if the
                            backend does not train.
  quantization              a table's `quantization_config` (TF's simulated
                            quantization): lookups of the quantized rows, a
                            step whose gradients pass straight through, the
                            serving copy alike; or refused naming it.
  checkpoint                TF's layout (`<table>`, `<table>.S<slot>`) and a
                            bit-exact save / restore round trip.
  serving-parity            `ServingEmbedding.from_backend` (what an export
                            holds) looks up the same activations.

A backend that cannot run here at all is checked by `check_unavailable`: it
must refuse with `BackendUnavailableError` giving its reason.

The checks call the backend eagerly, outside `strategy.run`, with small
tables (vocabulary 23, dimension 7: odd sizes catch shape bugs).

Example (a third-party backend's tests; pytest):
  >>> from backends import conformance
  >>> suite = conformance.Conformance(MyBackend)  # or a factory + capabilities
  >>> @pytest.mark.parametrize("check", conformance.check_names())
  ... def test_conformance(check):
  ...   suite.run(check)
  Or all at once: `conformance.run_conformance(MyBackend)`.
"""

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from backends import base, registry
from backends import checkpoint as checkpoint_lib
from backends import reference_optimizers as ref
from backends.errors import BackendError

E = tf.tpu.experimental.embedding

#: `make_backend(feature_config, optimizer)` -> an unbuilt backend.
BackendFactory = Callable[[Any, Any], base.EmbeddingBackend]

VOCAB, DIM, BATCH, SEQ = 23, 7, 5, 3
KINDS = ("dense", "sparse", "ragged")
COMBINERS = ("sum", "mean", "sqrtn")
RTOL, ATOL = 1e-5, 1e-6

#: The optimizer cases of `optimizer/<case>`; each is a fresh optimizer.
OPTIMIZER_CASES: dict[str, Callable[[], Any]] = {
  "SGD": lambda: E.SGD(0.1),
  "Adagrad": lambda: E.Adagrad(0.1),
  "Adagrad-clip-decay": lambda: E.Adagrad(
    0.1,
    clipvalue=0.5,
    weight_decay_factor=0.1,
    multiply_weight_decay_factor_by_learning_rate=True,
    clip_weight_min=-0.3,
    clip_weight_max=0.3,
  ),
  "AdagradMomentum": lambda: E.AdagradMomentum(
    0.1, momentum=0.9, use_nesterov=True, beta2=0.9, exponent=3
  ),
  "Adam": lambda: E.Adam(0.05),
  "Adam-dense": lambda: E.Adam(0.05, lazy_adam=False, sum_inside_sqrt=False),
  "FTRL": lambda: E.FTRL(
    0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.01
  ),
  "FTRL-beta-linear-by-lr": lambda: E.FTRL(
    0.2,
    l1_regularization_strength=0.01,
    beta=0.1,
    multiply_linear_by_learning_rate=True,
  ),
}


class ConformanceError(BackendError, AssertionError):
  """A backend's behaviour does not match what its capabilities declare."""


def check_names() -> list[str]:
  """Every check's name, in the order `run_conformance` runs them."""
  names = [f"lookup/{kind}" for kind in KINDS]
  names += ["lookup/sparse-weighted", "lookup/ragged-weighted"]
  names += [f"combiner/{c}" for c in COMBINERS]
  names += ["sequence"]
  names += [f"optimizer/{case}" for case in OPTIMIZER_CASES]
  names += ["quantization", "checkpoint", "serving-parity"]
  return names


# -- inputs and NumPy references -----------------------------------------------

# Five bags: repeated ids, an empty bag (not for dense ids), the last row.
_BAGS = [[1, 2, 2], [3], [], [4, 5, 22], [0, 0]]
_DENSE_BAGS = [[1, 2, 2], [3, 3, 7], [0, 4, 5], [22, 6, 1], [0, 0, 9]]
_SECOND = [[7], [2, 9], [3, 3, 3], [], [22]]  # a second feature, same table
_DENSE_SECOND = [[7, 2], [2, 9], [3, 3], [1, 22], [22, 0]]


def _weights_like(bags: list[list[int]], seed: int) -> list[list[float]]:
  rng = np.random.default_rng(seed)
  return [[float(w) for w in rng.uniform(0.5, 2.0, len(b))] for b in bags]


def _as_input(bags, kind: str, dtype=tf.int64) -> Any:
  """Python lists of bags as a dense, sparse or ragged `[B, None]` tensor."""
  if kind == "dense":
    return tf.constant(bags, dtype)
  ragged = tf.ragged.constant(bags, dtype=dtype, ragged_rank=1)
  if kind == "ragged":
    return ragged
  return ragged.to_sparse()


def reference_lookup(
  table: np.ndarray,
  bags: Sequence[Sequence[int]],
  weights: Sequence[Sequence[float]] | None,
  combiner: str,
) -> np.ndarray:
  """`[B, D]`: each bag's rows, weighted, over the combiner's normaliser."""
  out = np.zeros((len(bags), table.shape[1]), np.float64)
  for b, ids in enumerate(bags):
    w = np.ones(len(ids)) if weights is None else np.asarray(weights[b])
    norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}
    if len(ids) and norm[combiner] > 0:
      out[b] = (w[:, None] * table[list(ids)]).sum(0) / norm[combiner]
  return out


#: The `quantization` check's `QuantizationConfig(num_buckets, lower, upper)`:
#: the default initializer's rows (stddev 1/sqrt(7)) often fall outside.
QUANTIZATION = (5, -0.3, 0.3)


def reference_quantize(
  values: np.ndarray, num_buckets: int, lower: float, upper: float
) -> np.ndarray:
  """TF's simulated quantization (`QuantizationConfig`'s formula), float32."""
  lo, hi = np.float32(lower), np.float32(upper)
  quantum = (hi - lo) / np.float32(num_buckets - 1)
  clipped = np.clip(np.asarray(values, np.float32), lo, hi)
  return np.floor((clipped - lo) / quantum + np.float32(0.5)) * quantum + lo


def reference_sequence(
  table: np.ndarray, bags: Sequence[Sequence[int]], length: int
) -> np.ndarray:
  """`[B, L, D]`: each id's row at its position, zeros past the bag's end."""
  out = np.zeros((len(bags), length, table.shape[1]), np.float64)
  for b, ids in enumerate(bags):
    for pos, i in enumerate(ids[:length]):
      out[b, pos] = table[i]
  return out


def reference_row_gradients(
  bags: Sequence[Sequence[int]],
  weights: Sequence[Sequence[float]] | None,
  combiner: str,
  upstream: np.ndarray,
) -> dict[int, np.ndarray]:
  """d(loss)/d(row) per id, given d(loss)/d(activations) `upstream` `[B, D]`."""
  grads: dict[int, np.ndarray] = {}
  for b, ids in enumerate(bags):
    w = np.ones(len(ids)) if weights is None else np.asarray(weights[b])
    norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}
    for i, wi in zip(ids, w):
      scale = wi / norm[combiner] if norm[combiner] > 0 else 0.0
      grads[i] = grads.get(i, 0.0) + scale * upstream[b].astype(np.float64)
  return grads


def _case_row_gradients(
  case: "_Case", w_a: Any, upstream: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
  """A two-feature case's sorted ids and their summed row gradients `[U, D]`
  (features "a" and "b" share table "t"; only "a" may be weighted)."""
  bags_a, bags_b = case.bags
  grads = reference_row_gradients(bags_a, w_a, case.combiner, upstream["a"])
  for i, g in reference_row_gradients(
    bags_b, None, case.combiner, upstream["b"]
  ).items():
    grads[i] = grads.get(i, 0.0) + g
  ids = np.array(sorted(grads), np.int64)
  return ids, np.stack([grads[i] for i in ids])


def linear_loss_step(
  backend: base.EmbeddingBackend, features: Any, weights: Any, cotangents: Any
) -> Any:
  """One training step of `loss = sum_f <acts_f, cotangents_f>`.

  The loss's gradient with respect to each feature's activations is its
  cotangent, so the rows' gradients are known in closed form
  (`reference_row_gradients`). Returns the activations.
  """
  with tf.GradientTape() as tape:
    acts = backend.lookup(features, weights, training=True)
    tape.watch(acts)
    loss = tf.add_n([tf.reduce_sum(acts[k] * cotangents[k]) for k in acts])
  backend.apply_gradients(tape.gradient(loss, acts))
  return acts


def _numpy(variable: Any) -> np.ndarray:
  return np.asarray(tf.convert_to_tensor(variable))


def _tables(backend: base.EmbeddingBackend) -> dict[str, np.ndarray]:
  return {
    backend.table_name(t): _numpy(v)
    for t, v in backend.embedding_tables.items()
  }


def _slots(backend: base.EmbeddingBackend) -> dict[str, dict[str, np.ndarray]]:
  return {
    name: {k: _numpy(v) for k, v in slots.items()}
    for name, slots in backend.slot_variables().items()
  }


def _close(got, want, what: str) -> None:
  try:
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
  except AssertionError as e:
    raise ConformanceError(f"{what}: {e}") from e


def _refused(
  call: Callable[[], Any],
  errors: tuple[type[Exception], ...],
  what: str,
  *names: str,
) -> None:
  """`call` must raise one of `errors` whose message names every `names`."""
  try:
    call()
  except errors as e:
    missing = [n for n in names if n not in str(e)]
    if missing:
      raise ConformanceError(
        f"{what}: refused with {type(e).__name__}, but its message does not "
        f"name {missing}: {e}"
      ) from e
    return
  except Exception as e:
    raise ConformanceError(
      f"{what}: expected {' or '.join(c.__name__ for c in errors)}, got "
      f"{type(e).__name__}: {e}"
    ) from e
  raise ConformanceError(
    f"{what}: accepted, but the backend's capabilities do not declare it."
  )


# -- the suite -----------------------------------------------------------------


@dataclasses.dataclass
class _Case:
  """One table `t`, features `a` (bags, maybe weighted) and `b` (sharing t)."""

  kind: str
  combiner: str
  weighted: bool
  table: str = "t"

  def config(self, optimizer=None, sequence: bool = False) -> dict:
    table = E.TableConfig(
      VOCAB, DIM, combiner=self.combiner, name=self.table, optimizer=optimizer
    )
    return {
      "a": E.FeatureConfig(table, name="a"),
      "b": E.FeatureConfig(
        table, name="b", max_sequence_length=SEQ if sequence else 0
      ),
    }

  @property
  def bags(self) -> tuple[list, list]:
    if self.kind == "dense":
      return _DENSE_BAGS, _DENSE_SECOND
    return _BAGS, _SECOND

  def inputs(self) -> tuple[dict, dict | None]:
    a, b = self.bags
    features = {"a": _as_input(a, self.kind), "b": _as_input(b, self.kind)}
    if not self.weighted:
      return features, None
    weights = _as_input(_weights_like(a, 1), self.kind, None)
    return features, {"a": weights, "b": None}


class Conformance:
  """The checks of one backend; built backends are shared between checks.

  Args:
    make_backend: a backend class, or `make_backend(feature_config,
      optimizer)` returning an unbuilt backend (e.g. with keyword options or
      a strategy bound).
    capabilities: what the backend declares; default
      `make_backend.capabilities` (a backend class has them).
  """

  def __init__(
    self,
    make_backend: BackendFactory | type[base.EmbeddingBackend],
    capabilities: base.Capabilities | None = None,
  ):
    self._make = make_backend
    caps = capabilities or getattr(make_backend, "capabilities", None)
    if not isinstance(caps, base.Capabilities):
      raise TypeError(
        "Conformance needs the backend's capabilities: pass a backend class "
        "or capabilities=backends.base.Capabilities(...)."
      )
    self.capabilities = caps
    self._lookup_backend: base.EmbeddingBackend | None = None

  # -- running ---------------------------------------------------------------

  def run(self, name: str) -> None:
    """Runs the check `name` (see `check_names`).

    Raises:
      ConformanceError: the backend does not do what it declares.
      ValueError: no such check.
    """
    group, _, arg = name.partition("/")
    checks: dict[str, Callable[[str], None]] = {
      "lookup": self._check_lookup,
      "combiner": self._check_combiner,
      "sequence": lambda _: self._check_sequence(),
      "optimizer": self._check_optimizer,
      "quantization": lambda _: self._check_quantization(),
      "checkpoint": lambda _: self._check_checkpoint(),
      "serving-parity": lambda _: self._check_serving_parity(),
    }
    if name not in check_names():
      raise ValueError(f"unknown check {name!r}; checks: {check_names()}.")
    checks[group](arg)

  def run_all(self) -> None:
    """Runs every check; raises one `ConformanceError` listing the failures."""
    failures = []
    for name in check_names():
      try:
        self.run(name)
      except ConformanceError as e:
        failures.append(f"{name}: {e}")
    if failures:
      raise ConformanceError(
        f"{len(failures)} check(s) failed:\n" + "\n".join(failures)
      )

  # -- helpers ---------------------------------------------------------------

  def _supports(self, kind: str) -> bool:
    return kind in self.capabilities.input_kinds

  def _kind(self) -> str:
    """The input kind the training and checkpoint checks feed."""
    for kind in ("ragged", "sparse", "dense"):
      if self._supports(kind):
        return kind
    raise ConformanceError("the backend declares no input kind at all.")

  def _combiner(self) -> str:
    for combiner in COMBINERS:
      if combiner in self.capabilities.combiners:
        return combiner
    raise ConformanceError("the backend declares no combiner at all.")

  def _default_optimizer(self) -> Any:
    """An optimizer the backend declares (None for lookup-only backends)."""
    if not self.capabilities.trains:
      return None
    for cls in base.OPTIMIZER_CLASSES:  # SGD first
      if cls in self.capabilities.optimizers:
        return cls(0.1)
    raise ConformanceError("the backend trains but declares no optimizer.")

  def _build(self, config, optimizer) -> base.EmbeddingBackend:
    backend = self._make(config, optimizer)
    with backend.strategy.scope():
      backend.build()
    return backend

  # -- lookups ---------------------------------------------------------------

  def _lookup_config(self) -> dict:
    """One table per declared combiner, each with two features."""
    config = {}
    for c in COMBINERS:
      if c in self.capabilities.combiners:
        case = _Case("ragged", c, False, table=f"t_{c}").config()
        config.update({f"{c}_{k}": f for k, f in case.items()})
    return config

  def _check_lookup(self, arg: str) -> None:
    kind, _, weighted = arg.partition("-")
    if self._lookup_backend is None:
      self._lookup_backend = self._build(
        self._lookup_config(), self._default_optimizer()
      )
    backend = self._lookup_backend
    features, weights = {}, {}
    for c in COMBINERS:
      if c in self.capabilities.combiners:
        f, w = _Case(kind, c, bool(weighted), table=f"t_{c}").inputs()
        features.update({f"{c}_{k}": v for k, v in f.items()})
        weights.update({f"{c}_{k}": v for k, v in (w or {}).items()})

    def call():
      return backend.lookup(features, weights or None)

    what = f"lookup of {arg} ids"
    if not self._supports(kind):
      _refused(
        call,
        (base.UnsupportedInputError,),
        what + f" ('{kind}' not in input_kinds)",
        kind,
        "feature",
      )
      return
    got = call()
    tables = _tables(backend)
    for c in COMBINERS:
      if c not in self.capabilities.combiners:
        continue
      case = _Case(kind, c, bool(weighted))
      bags_a, bags_b = case.bags
      w_a = _weights_like(bags_a, 1) if weighted else None
      values = tables[f"t_{c}"]
      _close(
        got[f"{c}_a"],
        reference_lookup(values, bags_a, w_a, c),
        f"{what}, combiner {c}",
      )
      _close(
        got[f"{c}_b"],
        reference_lookup(values, bags_b, None, c),
        f"{what}, combiner {c}, second feature of the table",
      )

  def _check_combiner(self, combiner: str) -> None:
    config = _Case(self._kind(), combiner, False).config()

    def make():
      return self._make(config, self._default_optimizer())

    if combiner in self.capabilities.combiners:
      make()
      return
    _refused(
      make,
      (base.UnsupportedConfigError,),
      f"a table with combiner {combiner!r}",
      "'t'",
      combiner,
    )

  def _check_sequence(self) -> None:
    kind = self._kind()
    case = _Case(kind, self._combiner(), False)
    config = case.config(sequence=True)
    if not self.capabilities.sequence_features:
      _refused(
        lambda: self._make(config, self._default_optimizer()),
        (base.UnsupportedConfigError,),
        "a sequence feature (sequence_features=False)",
        "'b'",
      )
      return
    backend = self._build(config, self._default_optimizer())
    features, _ = case.inputs()
    got = backend.lookup(features)["b"]
    values = _tables(backend)["t"]
    _close(
      got,
      reference_sequence(values, case.bags[1], SEQ),
      f"sequence feature (max_sequence_length={SEQ}) of {kind} ids",
    )

  # -- training --------------------------------------------------------------

  def _training_case(self) -> _Case:
    kind = self._kind()
    return _Case(kind, self._combiner(), kind != "dense")

  def _train_steps(
    self, backend: base.EmbeddingBackend, case: _Case, steps: int
  ) -> list[dict[str, np.ndarray]]:
    """Runs `steps` steps with fixed upstream gradients; returns them."""
    features, weights = case.inputs()
    rng = np.random.default_rng(3)
    upstreams = []
    for _ in range(steps):
      upstream = {
        k: rng.normal(size=(BATCH, DIM)).astype(np.float32) for k in features
      }
      linear_loss_step(backend, features, weights, upstream)
      upstreams.append(upstream)
    return upstreams

  def _check_optimizer(self, case_name: str) -> None:
    optimizer = OPTIMIZER_CASES[case_name]()
    case = self._training_case()
    config = case.config(optimizer)
    opt_name = type(optimizer).__name__
    if not self.capabilities.trains:
      backend = self._build(config, None)
      _refused(
        lambda: self._train_steps(backend, case, 1),
        (NotImplementedError,),
        "training a lookup-only backend (trains=False)",
        repr(type(backend).name),
      )
      return
    if type(optimizer) not in self.capabilities.optimizers:
      _refused(
        lambda: self._make(config, None),
        (base.UnsupportedConfigError,),
        f"a table with optimizer {opt_name}",
        "'t'",
        opt_name,
      )
      return
    backend = self._build(config, None)
    table = _tables(backend)["t"].astype(np.float64)
    slots = _slots(backend).get("t", {})
    want_slots = ref.initial_slots(optimizer, VOCAB, DIM)
    if sorted(slots) != sorted(want_slots):
      raise ConformanceError(
        f"{opt_name}: slots {sorted(slots)}; TF's layout has "
        f"{sorted(want_slots)} (docs/optimizers.md#slot-names-in-checkpoints)."
      )
    for k, v in want_slots.items():
      _close(slots[k], v, f"{opt_name}: initial value of slot {k!r}")
    upstreams = self._train_steps(backend, case, 2)
    w_a = _weights_like(case.bags[0], 1) if case.weighted else None
    for upstream in upstreams:
      ids, grads = _case_row_gradients(case, w_a, upstream)
      table, slots = ref.apply(optimizer, table, slots, ids, grads)
    what = f"{case_name} after 2 steps ({case.kind} ids, {case.combiner})"
    _close(_tables(backend)["t"], table, what + ": table")
    got_slots = _slots(backend).get("t", {})
    for k, v in slots.items():
      _close(got_slots[k], v, what + f": slot {k!r}")

  def _check_quantization(self) -> None:
    case = self._training_case()
    optimizer = self._default_optimizer()
    config = case.config(optimizer)
    config["a"].table.quantization_config = E.QuantizationConfig(*QUANTIZATION)
    if not self.capabilities.quantization:
      _refused(
        lambda: self._make(config, optimizer),
        (base.UnsupportedConfigError,),
        "a table with a quantization_config (quantization=False)",
        "'t'",
        "quantization_config",
      )
      return
    serving: Any = registry.get(registry.for_export())

    backend = self._build(config, optimizer)
    table = _tables(backend)["t"]
    features, weights = case.inputs()
    got = backend.lookup(features, weights)
    bags_a, bags_b = case.bags
    w_a = _weights_like(bags_a, 1) if case.weighted else None
    quantized = reference_quantize(table, *QUANTIZATION)
    what = f"quantized lookup ({case.kind} ids, {case.combiner})"
    _close(
      got["a"], reference_lookup(quantized, bags_a, w_a, case.combiner), what
    )
    _close(
      got["b"], reference_lookup(quantized, bags_b, None, case.combiner), what
    )
    served = serving.from_backend(backend).lookup(features, weights)
    for k in ("a", "b"):
      _close(served[k], got[k], f"{what}: serving copy, feature {k!r}")
    if not self.capabilities.trains:
      return
    (upstream,) = self._train_steps(backend, case, 1)
    ids, grads = _case_row_gradients(case, w_a, upstream)
    want, _ = ref.apply(
      optimizer,
      table.astype(np.float64),
      ref.initial_slots(optimizer, VOCAB, DIM),
      ids,
      grads,
    )
    _close(_tables(backend)["t"], want, f"{what}: a step, straight through")

  # -- checkpoints and serving -----------------------------------------------

  def _trained_backend(self) -> tuple[base.EmbeddingBackend, _Case, Any]:
    case = self._training_case()
    optimizer = None
    if self.capabilities.trains:
      optimizer = (
        E.Adagrad(0.1)
        if E.Adagrad in self.capabilities.optimizers
        else self._default_optimizer()
      )
    backend = self._build(case.config(), optimizer)
    if self.capabilities.trains:
      self._train_steps(backend, case, 1)
    return backend, case, optimizer

  def _check_checkpoint(self) -> None:
    backend, case, optimizer = self._trained_backend()
    with tempfile.TemporaryDirectory() as tmp:
      path = tf.train.Checkpoint(embedding=backend).save(f"{tmp}/ckpt")
      names = {n for n, _ in tf.train.list_variables(path)}
      wanted = ["t"] + [f"t.S{s}" for s in _slots(backend).get("t", {})]
      for key in wanted:
        if f"embedding/{key}/.ATTRIBUTES/VARIABLE_VALUE" not in names:
          raise ConformanceError(
            f"checkpoint: no entry {key!r} under 'embedding/' (TF's "
            f"mid-level layout); it holds {sorted(names)}."
          )
      fresh = self._make(case.config(), optimizer)
      with fresh.strategy.scope():
        fresh.build()
      checkpoint_lib.restore(fresh, path)
    _close(_tables(fresh)["t"], _tables(backend)["t"], "checkpoint: table")
    for k, v in _slots(backend).get("t", {}).items():
      _close(_slots(fresh)["t"][k], v, f"checkpoint: slot {k!r}")

  def _check_serving_parity(self) -> None:
    serving: Any = registry.get(registry.for_export())

    backend, case, _ = self._trained_backend()
    features, weights = case.inputs()
    served = serving.from_backend(backend).lookup(features, weights)
    got = backend.lookup(features, weights)
    for k in ("a", "b"):
      _close(served[k], got[k], f"serving copy vs backend, feature {k!r}")


def run_conformance(
  make_backend: BackendFactory | type[base.EmbeddingBackend],
  capabilities: base.Capabilities | None = None,
) -> None:
  """Runs every check on one backend (see `Conformance`).

  Raises:
    ConformanceError: listing every failed check.
  """
  Conformance(make_backend, capabilities).run_all()


def check_unavailable(
  backend_class: type[base.EmbeddingBackend],
  strategy: tf.distribute.Strategy | None = None,
) -> str:
  """A backend that cannot run under `strategy` must say so and refuse.

  Returns:
    its reason (`unavailable_reason`).

  Raises:
    ConformanceError: it has no reason, or constructing it does not raise
      `BackendUnavailableError` naming the backend.
  """
  strategy = strategy or tf.distribute.get_strategy()
  reason = backend_class.unavailable_reason(strategy)
  if not reason:
    raise ConformanceError(
      f"{backend_class.__name__} gives no unavailable_reason under "
      f"{type(strategy).__name__}; run the suite on it instead."
    )
  config = _Case("dense", "sum", False).config()
  _refused(
    lambda: backend_class(config, E.SGD(0.1), strategy),
    (base.BackendUnavailableError,),
    f"constructing {backend_class.__name__} under {type(strategy).__name__}",
    repr(backend_class.name),
  )
  return reason
