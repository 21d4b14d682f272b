"""Exports a trained model as a SavedModel that serves on CPU.

The embeddings are the serving backend's: a slot-free
`backends.mid_level.serving.ServingEmbedding` copy of a restored run's tables
(`recsys.run.restored.RestoredRun`; trained with any backend, the CLI
restores them from the checkpoint), looked up with
`backends.mid_level.serving.serving_lookup`, so serving has the output shapes of
training and needs no TPU. This module adds the serving signatures.

Id signatures ("serving_default" and, for retrieval, "query_embeddings",
"candidate_embeddings") take the ids a data source delivers, one tensor each:
  dense              float32 `[B, num_dense]`         (with dense features)
  <feature>          int64 `[B]` for one-hot features; `[B, W]` padded with -1
                     for multi-hot (W = spec.max_ids) and sequence features
                     (W = spec.sequence_length)
  <feature>_weights  float32 `[B, W]` for weighted features (ignored where the
                     id is -1)

Outputs:
  ranking:   {"scores": float32 `[B]`} (probabilities, or ratings for MSE)
  retrieval: {"scores": `[B, k]`, "candidate_ids": int64 `[B, k]`} over the
             whole candidate corpus (brute force), plus the signatures
             "query_embeddings" and "candidate_embeddings" (`[B, K]`);
             k is `export(..., k=)`: a positive int at most the corpus
             size, default `DEFAULT_K` (the corpus size if smaller).

Every input of a signature has the same batch size B, checked in the graph
with its other inputs (`serving_checks.checked_shapes`): a client that has
only TensorFlow gets an error naming the inputs and their sizes.

Raw signatures ("serving_raw" and, for retrieval, "raw_query_embeddings",
"raw_candidate_embeddings") take raw values instead, for sources with a
`recsys.data.raw.RawParser` (Criteo, MovieLens): the parser the source's
reader uses runs inside the graph, so a client sends what is in the data
files and gets the scores training would give:
  Criteo     I1..I13, C1..C26: string `[B]` each, as in the TSV ("" = missing)
  MovieLens  user_id, item_id: string `[B]` raw ids; timestamp: int64 `[B]`
             seconds (if the model uses it); side features come from the
             tables built from the training files.
Their outputs are those of the id signatures, plus `unknown_<input>` bool `[B]`
(True where a raw id is not in the vocabulary and mapped to id 0) and, for
retrieval, "candidate_raw_ids" (string `[B, k]`). Synthetic sources have no
raw form and no raw signatures.

Top k without what a user has seen (retrieval, when the source has a query
id and a finite training split): "top_k" (the id signature's inputs) and
"top_k_raw" (the raw signature's: for MovieLens only the raw user id), each
with `exclude_seen` bool `[B]`. A row with `exclude_seen` True leaves out
the candidates its user interacted with in the training split, looked up
from the user id in the export's own table
(`recsys.models.retrieval.seen_items`), as `exclude_seen` evaluation ranks
them; missing results are id -1 (raw id "") with score -inf. See
docs/retrieval.md.

Example:
  >>> path = export(run, "/tmp/export")   # run: a RestoredRun
  >>> serve = tf.saved_model.load(path).signatures["serving_default"]
  >>> serve(dense=..., C1=..., C7=...)["scores"]
  >>> raw = tf.saved_model.load(path).signatures["serving_raw"]
  >>> raw(I1=tf.constant(["3"]), ...,
  ...     C1=tf.constant(["68fd1e64"]), ...)["scores"]
"""

import logging
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

from backends.mid_level import serving
from recsys._keras import keras, tf
from recsys.data.raw import RawParser
from recsys.errors import SettingsError
from recsys.feature_spec import FeatureSpec
from recsys.model_dir import atomic_dir
from recsys.models.errors import ModelConfigError
from recsys.models.retrieval import index as retrieval_index
from recsys.models.retrieval import seen_items as seen_lib
from recsys.process import console
from recsys.run.restored import RestoredRun
from recsys.serving import checks as serving_checks
from recsys.serving import lookup as serving_lookup
from recsys.serving.id_maps import IdMaps

log = logging.getLogger("recsys.export")

#: Candidates per query of the top-k signatures when `k` is not given (the
#: whole corpus when it holds fewer).
DEFAULT_K = 100


class ExportConfigError(SettingsError):
  """An export setting that cannot be honoured (e.g. `k`): exit status 2."""


def checked_k(k: Any, retrieval: bool, model: str) -> int | None:
  """`k` as an int, or None (the default), checked before any work.

  Args:
    k: candidates per query of the top-k signatures, or None.
    retrieval: whether the model retrieves (only then is there a top k).
    model: the model's name, for the message.

  Raises:
    ExportConfigError: `k` is not a positive integer, or is given for a
      ranking model (whose signatures return one score per example).
  """
  if k is None:
    return None
  if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
    raise ExportConfigError(
      f"export: k={k!r} is not a positive integer; k is the number of "
      "candidates the top-k signatures return per query (default "
      f"{DEFAULT_K}, or the whole corpus if it holds fewer)."
    )
  if not retrieval:
    raise ExportConfigError(
      f"export: k={k} applies to retrieval models (their top-k "
      f"signatures); {model} is a ranking model, whose signatures return "
      "one score per example: leave k out."
    )
  return int(k)


def top_k_size(k: int | None, num_candidates: int) -> int:
  """The k of the top-k signatures over a corpus of `num_candidates`.

  None gives `DEFAULT_K`, or `num_candidates` if fewer. A k above the
  corpus size is refused rather than cut: the signatures would return
  fewer columns than asked for.

  Raises:
    ExportConfigError: `k` is more than `num_candidates`.
  """
  if k is None:
    return min(DEFAULT_K, num_candidates)
  if k > num_candidates:
    raise ExportConfigError(
      f"export: k={k} is more than the {num_candidates} candidates of the "
      f"corpus; the top-k signatures can return at most {num_candidates} "
      f"per query. Pass k <= {num_candidates}, or leave k out (the whole "
      f"corpus up to {DEFAULT_K})."
    )
  return k


def _width(spec: FeatureSpec) -> int:
  """0 for one-hot ids `[B]`, else the padded width W of `[B, W]`."""
  if spec.sequence_length:
    return spec.sequence_length
  if spec.multi_hot:
    return spec.max_ids
  return 0


def input_signature(
  specs: Sequence[FeatureSpec], num_dense: int, names: Sequence[str]
) -> dict[str, tf.TensorSpec]:
  """The raw-feature `TensorSpec`s of the serving signature for `names`."""
  by_name = {s.name: s for s in specs}
  signature = {}
  if num_dense:
    signature["dense"] = tf.TensorSpec([None, num_dense], tf.float32, "dense")
  for name in names:
    spec = by_name[name]
    width = _width(spec)
    shape = [None, width] if width else [None]
    signature[name] = tf.TensorSpec(shape, tf.int64, name)
    if spec.weighted and width and not spec.sequence_length:
      signature[f"{name}_weights"] = tf.TensorSpec(
        shape, tf.float32, f"{name}_weights"
      )
  return signature


def to_features(
  inputs: Mapping[str, tf.Tensor],
  specs: Sequence[FeatureSpec],
  names: Sequence[str],
) -> dict[str, Any]:
  """Raw signature inputs -> a batch's `features` dict (the data contract).

  Padded `[B, W]` ids (-1 = padding; other negative ids too, except raw
  ids, `FeatureSpec.raw_ids`, which may be any other int64) become
  `tf.RaggedTensor` `[B, None]`.
  Shapes and ids are checked first (`serving_checks`: an error naming the
  inputs and shapes, or the feature, row and id).
  """
  inputs = serving_checks.checked_shapes(inputs)
  inputs = serving_checks.checked_ids(inputs, specs, names)
  by_name = {s.name: s for s in specs}
  categorical, weights = {}, {}
  for name in names:
    ids = inputs[name]
    if _width(by_name[name]):
      # -1 pads a row; raw ids (any int64) may be negative otherwise.
      raw = getattr(by_name[name], "raw_ids", False)
      mask = tf.not_equal(ids, -1) if raw else ids >= 0
      categorical[name] = tf.ragged.boolean_mask(ids, mask)
      if f"{name}_weights" in inputs:
        weights[name] = tf.ragged.boolean_mask(inputs[f"{name}_weights"], mask)
    else:
      categorical[name] = ids
  features = {"categorical": categorical}
  if weights:
    features["weights"] = weights
  if "dense" in inputs:
    features["dense"] = inputs["dense"]
  return features


class ServingModule(tf.Module):
  """The exported object: model, serving embedding and the serving functions.

  Args:
    model: the trained ranking or retrieval model.
    embedding: a built `backends.mid_level.serving.ServingEmbedding` holding the
      trained tables (e.g. `ServingEmbedding.from_backend(run.backend)`).
    specs: the data source's feature specs.
    num_dense: width of `features["dense"]`.
    corpus: retrieval only: (candidate ids `[N]`, embeddings `[N, K]`).
    k: retrieval only: candidates returned per query, 1 to N (None:
      `DEFAULT_K`, or N if fewer); `checked_k`, `top_k_size`.
    raw_parser: the data source's raw-value parser (`source.raw_parser()`);
      None: no raw signatures.
    seen: retrieval only: each user's training candidates
      (`recsys.models.retrieval.seen_items.SeenItems`); adds the "top_k" and
      "top_k_raw" signatures, which can leave them out.
    query_id_feature: the query id `seen` is keyed by (e.g. "user_id").
    id_maps: how tables fed raw ids map them to rows
      (`recsys.serving.id_maps.IdMaps.for_run`); None: every table takes
      ids as rows.
  """

  def __init__(
    self,
    model: keras.Model,
    embedding: serving.ServingEmbedding,
    specs: Sequence[FeatureSpec],
    num_dense: int,
    corpus=None,
    k: int | None = None,
    raw_parser: RawParser | None = None,
    seen: seen_lib.SeenItems | None = None,
    query_id_feature: str | None = None,
    id_maps: IdMaps | None = None,
  ):
    k = checked_k(k, corpus is not None, type(model).__name__)
    super().__init__(name="recsys_serving")
    self.model = model
    self.embedding = embedding
    self.id_maps = id_maps  # tracked: its hash tables are saved
    self.raw_parser = raw_parser  # tracked: its vocabulary tables are saved
    self._specs = list(specs)
    self._num_dense = num_dense
    self._retrieval = corpus is not None
    if self._retrieval:
      ids, embeddings = corpus
      self.corpus_ids = tf.Variable(tf.cast(ids, tf.int64), trainable=False)
      self.corpus_embeddings = tf.Variable(embeddings, trainable=False)
      self._k = top_k_size(k, int(ids.shape[0]))
      self._id_space = int(tf.reduce_max(ids)) + 1 if ids.shape[0] else 1
    if seen is not None and not query_id_feature:
      raise ValueError(
        "ServingModule: seen items need the query_id_feature they are "
        "keyed by (e.g. 'user_id')."
      )
    self.seen = seen
    self._query_id = query_id_feature or ""

  def activations(self, features: Mapping[str, Any], names: Sequence[str]):
    """Embedding lookups of `names` on the serving embedding's tables (raw
    ids first made rows by `id_maps`, where tables take them)."""
    if self.id_maps is not None:
      features = self.id_maps.rows(features, names)
    return serving_lookup.serving_activations(self.embedding, features, names)

  def signatures(self) -> dict[str, Any]:
    """Concrete functions to save as the SavedModel's signatures."""
    names = list(self.embedding.feature_config)
    if not self._retrieval:
      sig = input_signature(self._specs, self._num_dense, names)

      @tf.function(autograph=False)
      def serve(inputs):
        features = to_features(inputs, self._specs, names)
        return {
          "scores": self.model(
            self.activations(features, names), features, training=False
          )
        }

      signatures = {"serving_default": serve.get_concrete_function(sig)}
      if self.raw_parser is not None:
        signatures.update(self._raw_ranking_signatures(names))
      return signatures

    query, candidate = self.model.query_features, self.model.candidate_features
    q_sig = input_signature(self._specs, self._num_dense, query)
    c_sig = input_signature(self._specs, 0, candidate)

    @tf.function(autograph=False)
    def query_embeddings(inputs):
      features = to_features(inputs, self._specs, query)
      acts = self.activations(features, query)
      return {"embeddings": self.model.query_embeddings(acts, features)}

    @tf.function(autograph=False)
    def candidate_embeddings(inputs):
      features = to_features(inputs, self._specs, candidate)
      acts = self.activations(features, candidate)
      return {"embeddings": self.model.candidate_embeddings(acts, features)}

    @tf.function(autograph=False)
    def top_k(inputs):
      q = query_embeddings(inputs)["embeddings"]
      scores = tf.matmul(q, self.corpus_embeddings, transpose_b=True)
      values, index = tf.math.top_k(scores, k=self._k)
      return {
        "scores": values,
        "candidate_ids": tf.gather(self.corpus_ids, index),
      }

    signatures = {
      "serving_default": top_k.get_concrete_function(q_sig),
      "query_embeddings": query_embeddings.get_concrete_function(q_sig),
      "candidate_embeddings": candidate_embeddings.get_concrete_function(c_sig),
    }
    if self.seen is not None:
      signatures.update(self._seen_id_signature(query_embeddings, q_sig))
    if self.raw_parser is not None:
      signatures.update(self._raw_retrieval_signatures())
    return signatures

  # -- top-k without what a user has seen --------------------------------------

  def _top_k_excluding(
    self, queries: tf.Tensor, user_ids: tf.Tensor, exclude: tf.Tensor
  ) -> dict[str, tf.Tensor]:
    """The corpus top-k of `queries` `[B, K]`; a row whose `exclude` is True
    leaves out the candidates its user (`user_ids` `[B]`) interacted with in
    training (ranked as the evaluation with `exclude_seen` ranks them). Rows
    with fewer than k others left get id -1 and score -inf at the end."""
    scores = tf.matmul(queries, self.corpus_embeddings, transpose_b=True)
    seen = retrieval_index.excluded_mask(
      self._seen.padded(user_ids), self._id_space
    )
    hidden = tf.gather(seen, self.corpus_ids, axis=1)
    hidden &= tf.reshape(tf.cast(exclude, tf.bool), [-1, 1])
    scores = tf.where(hidden, -float("inf"), scores)
    values, index = tf.math.top_k(scores, k=self._k)
    ids = tf.where(
      tf.gather(hidden, index, batch_dims=1),
      tf.constant(-1, tf.int64),
      tf.gather(self.corpus_ids, index),
    )
    return {"scores": values, "candidate_ids": ids}

  @property
  def _seen(self) -> seen_lib.SeenItems:
    if self.seen is None:
      raise ValueError("this export holds no seen items (seen=None)")
    return self.seen

  def _seen_id_signature(self, query_embeddings, q_sig) -> dict[str, Any]:
    """ "top_k": the id signature's inputs (plus the query id if the towers
    do not read it) and `exclude_seen` bool `[B]`."""
    sig = dict(q_sig)
    user = self._query_id
    if user not in sig:
      sig[user] = tf.TensorSpec([None], tf.int64, user)
    sig["exclude_seen"] = tf.TensorSpec([None], tf.bool, "exclude_seen")

    @tf.function(autograph=False)
    def top_k(inputs):
      # exclude_seen and a query id the towers do not read: checked with
      # the others (a [1] flag broadcast over B users; 3 flags for 2 users
      # failed in the graph).
      inputs = serving_checks.checked_shapes(inputs)
      exclude = inputs.pop("exclude_seen")
      user_ids = inputs[user] if user in q_sig else inputs.pop(user)
      q = query_embeddings(inputs)["embeddings"]
      return self._top_k_excluding(q, user_ids, exclude)

    return {"top_k": top_k.get_concrete_function(sig)}

  # -- raw signatures ---------------------------------------------------------

  @property
  def _parser(self) -> RawParser:
    """The source's raw parser (raw signatures exist only with one)."""
    if self.raw_parser is None:
      raise ValueError("this model's source has no raw form (raw_parser)")
    return self.raw_parser

  def _raw_features(
    self, inputs: Mapping[str, tf.Tensor], names: Sequence[str]
  ):
    """Raw inputs -> (features of `names`, `unknown_<input>` flags)."""
    inputs = serving_checks.checked_shapes(inputs)
    features = self._parser.parse_raw(inputs, names)
    unknown = {
      f"unknown_{k}": v for k, v in self._parser.unknown(inputs).items()
    }
    return features, unknown

  def _raw_ranking_signatures(self, names: Sequence[str]) -> dict[str, Any]:
    """ "serving_raw": raw values -> scores, via the source's own parser."""
    sig = self._parser.raw_feature_spec(names, dense=bool(self._num_dense))

    @tf.function(autograph=False)
    def serve_raw(inputs):
      features, unknown = self._raw_features(inputs, names)
      scores = self.model(
        self.activations(features, names), features, training=False
      )
      return {"scores": scores, **unknown}

    return {"serving_raw": serve_raw.get_concrete_function(sig)}

  def _raw_retrieval_signatures(self) -> dict[str, Any]:
    """The retrieval signatures on raw values: top-k and both towers."""
    query, candidate = self.model.query_features, self.model.candidate_features
    q_sig = self._parser.raw_feature_spec(query, dense=bool(self._num_dense))
    c_sig = self._parser.raw_feature_spec(candidate)

    def tower(names, embed):
      @tf.function(autograph=False)
      def embeddings(inputs):
        features, unknown = self._raw_features(inputs, names)
        acts = self.activations(features, names)
        return {"embeddings": embed(acts, features), **unknown}

      return embeddings

    raw_query = tower(query, self.model.query_embeddings)
    raw_candidate = tower(candidate, self.model.candidate_embeddings)
    id_feature = self.model.candidate_id_feature

    @tf.function(autograph=False)
    def raw_top_k(inputs):
      out = raw_query(inputs)
      scores = tf.matmul(
        out.pop("embeddings"), self.corpus_embeddings, transpose_b=True
      )
      values, index = tf.math.top_k(scores, k=self._k)
      ids = tf.gather(self.corpus_ids, index)
      out.update(scores=values, candidate_ids=ids)
      names = self._parser.raw_ids(id_feature, ids)
      if names is not None:
        out["candidate_raw_ids"] = names
      return out

    signatures = {
      "serving_raw": raw_top_k.get_concrete_function(q_sig),
      "raw_query_embeddings": raw_query.get_concrete_function(q_sig),
      "raw_candidate_embeddings": raw_candidate.get_concrete_function(c_sig),
    }
    if self.seen is not None:
      signatures["top_k_raw"] = self._seen_raw_signature(raw_query, q_sig)
    return signatures

  def _seen_raw_signature(self, raw_query, q_sig):
    """ "top_k_raw": "serving_raw"'s inputs (at least the raw user id) and
    `exclude_seen` bool `[B]`; the user's seen items come from the raw id."""
    user = self._query_id
    sig = dict(q_sig)
    sig.update(self._parser.raw_feature_spec([user]))
    sig["exclude_seen"] = tf.TensorSpec([None], tf.bool, "exclude_seen")
    id_feature = self.model.candidate_id_feature

    @tf.function(autograph=False)
    def top_k_raw(inputs):
      inputs = serving_checks.checked_shapes(inputs)  # exclude_seen too
      exclude = inputs.pop("exclude_seen")
      user_ids = self._parser.parse_raw(inputs, [user])["categorical"][user]
      out = raw_query({k: inputs[k] for k in q_sig})
      out.update(
        self._top_k_excluding(out.pop("embeddings"), user_ids, exclude)
      )
      names = self._parser.raw_ids(
        id_feature, tf.maximum(out["candidate_ids"], 0)
      )
      if names is not None:
        out["candidate_raw_ids"] = tf.where(
          out["candidate_ids"] >= 0, names, ""
        )
      return out

    return top_k_raw.get_concrete_function(sig)


#: Where `recsys export` says what was exported (model dir, step, changed
#: settings, input files), inside the SavedModel folder: TF Serving's
#: folder for extra files, which loaders ignore.
PROVENANCE_FILE = os.path.join("assets.extra", "recsys_export.json")


def export(
  run: RestoredRun,
  export_dir: str,
  k: int | None = None,
  extra_files: Mapping[str, str] | None = None,
) -> str:
  """Writes a CPU-serving SavedModel of a restored run's model.

  Args:
    run: the run whose checkpoint was restored (`recsys export` restores
      it on the registry's export backend, `backends.registry.for_export()`;
      a Trainer's is `trainer.run`).
    export_dir: the SavedModel directory: created, or replaced whole if it
      holds a SavedModel (a kill midway leaves the previous one).
    k: retrieval only: candidates the top-k signatures return per query,
      a positive int at most the corpus size; None: `DEFAULT_K`, or the
      whole corpus if it holds fewer.
    extra_files: relative path -> text, written into the SavedModel folder
      with it (e.g. `PROVENANCE_FILE`).

  Returns:
    `export_dir`.

  Raises:
    ExportConfigError: `k` is not a positive integer (checked first), is
      given for a ranking model, or is more than the corpus holds.
    atomic_dir.UnsafeReplaceError: `export_dir` is a non-empty directory
      that holds no SavedModel (it would be replaced and lost).
  """
  k = checked_k(k, run.is_retrieval, type(run.model).__name__)
  corpus = None
  if run.is_retrieval:
    run.index_corpus()
    ids, embeddings = run.model.corpus_index.corpus()
    corpus = (tf.convert_to_tensor(ids), tf.convert_to_tensor(embeddings))
    k = top_k_size(k, int(corpus[0].shape[0]))  # before the SavedModel
  raw_parser = run.source.raw_parser()
  if raw_parser is None:
    log.info(
      "export: no raw-feature signature: %s has no raw form (its "
      "raw_parser() is None, as for synthetic data); the signatures take "
      "ids.",
      type(run.source).__name__,
    )
  seen, query_id = _seen_items(run)
  module = ServingModule(
    run.model,
    serving.ServingEmbedding.from_backend(run.backend),
    run.source.feature_specs,
    int(getattr(run.source, "num_dense", 0) or 0),
    corpus=corpus,
    k=k,
    raw_parser=raw_parser,
    seen=seen,
    query_id_feature=query_id,
    id_maps=IdMaps.for_run(run),
  )
  # Written next to export_dir and swapped in whole: a kill at any moment
  # leaves the previous export (if any) loadable, never a mixture.
  with atomic_dir.replaced_atomically(
    export_dir, may_replace=_is_saved_model
  ) as tmp:
    signatures = module.signatures()
    tf.saved_model.save(module, tmp, signatures=signatures)
    for name, text in (extra_files or {}).items():
      path = os.path.join(tmp, name)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
  log.info(
    "exported signatures: %s%s",
    ", ".join(sorted(signatures)),
    f" (top {k} candidates per query)" if corpus is not None else "",
    extra=console.shown_as(console.STATUS),
  )
  return export_dir


def _seen_items(
  run: RestoredRun,
) -> tuple[seen_lib.SeenItems | None, str | None]:
  """(the training split's `SeenItems`, its query id feature) for the
  "top_k" signatures of a retrieval export; (None, None) when the source
  has no query id or no finite training split (logged)."""
  if not run.is_retrieval:
    return None, None
  try:
    query_id = seen_lib.query_id_feature_of(run.source)
    return run.seen_items(), query_id
  except ModelConfigError as e:
    log.info("export: no top_k signatures (seen items): %s", e)
    return None, None


def _is_saved_model(path: str) -> bool:
  """Whether `path` holds a SavedModel (which a new export may replace)."""
  return any(
    os.path.isfile(os.path.join(path, f))
    for f in ("saved_model.pb", "saved_model.pbtxt")
  )


__all__ = [
  "DEFAULT_K",
  "PROVENANCE_FILE",
  "ExportConfigError",
  "ServingModule",
  "checked_k",
  "export",
  "input_signature",
  "to_features",
  "top_k_size",
]
