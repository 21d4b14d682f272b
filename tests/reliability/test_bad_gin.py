"""Bad gin files: syntax errors, typos in names, wrong objects, shared tables.

tests/training/test_gin_config.py and tests/test_cli.py cover an unknown
parameter, an unbound `%gin.REQUIRED` macro and a missing file; this adds
what users get wrong next: a syntax error, a misspelt configurable /
optimizer / parameter / backend (each answered with the closest name), an
embedding optimizer written without parentheses, as a string or as a Keras
optimizer, a bad learning rate, and tables shared with conflicting settings.
Two cases run `recsys train` end to end.
"""

import functools

import gin
import pytest
import tensorflow as tf  # noqa: E402

import backends  # noqa: E402
import recsys  # noqa: F401  (Keras 2 before TensorFlow)
from recsys import cli, config  # noqa: E402
from recsys.errors import SettingsError  # noqa: E402
from recsys.feature_spec import FeatureSpec  # noqa: E402
from recsys.features import (
  EmbeddingSettings,
  FeatureConfigError,
  feature_config,
)  # noqa: E402
from recsys.gin_config import compat as gin_compat  # noqa: E402

E = tf.tpu.experimental.embedding
SPECS = [
  FeatureSpec("user", 23),
  FeatureSpec("item", 29),
  FeatureSpec("history", 29, multi_hot=True, max_ids=3, table="item"),
]


def parse(tmp_path, text, name="bad.gin"):
  path = tmp_path / name
  path.write_text(text)
  config.parse([str(path)])
  return str(path)


def parse_error(tmp_path, text) -> str:
  with pytest.raises(config.GinConfigError) as info:
    parse(tmp_path, text)
  return str(info.value)


def configured_feature_config(tmp_path, text):
  """feature_config(SPECS, the gin-configured EmbeddingSettings)."""
  parse(tmp_path, text)
  return feature_config(SPECS, gin.get_configurable(EmbeddingSettings)())


# -- gin syntax and names ------------------------------------------------------


def test_syntax_error_names_file_line_and_shows_the_line(tmp_path):
  message = parse_error(
    tmp_path, "EmbeddingSettings.dim = 8\ntrain.backend = 'tensorcore\n"
  )
  assert f"{tmp_path / 'bad.gin'}:2:" in message
  assert "gin syntax error" in message
  assert "train.backend = 'tensorcore" in message


def test_syntax_error_in_an_included_file_names_that_file(tmp_path):
  (tmp_path / "inner.gin").write_text("EmbeddingSettings.dim = = 3\n")
  message = parse_error(tmp_path, "include 'inner.gin'\n")
  assert f"{tmp_path / 'inner.gin'}:1:" in message


def test_a_binding_of_a_macro_nothing_uses_is_refused(tmp_path):
  """gin itself accepts it and the run silently keeps the file's value."""
  (tmp_path / "inner.gin").write_text("EmbeddingSettings.dim = %DIM\n")
  path = tmp_path / "outer.gin"
  path.write_text("DIM = 8\ninclude 'inner.gin'\n")
  with pytest.raises(config.GinConfigError) as info:
    config.parse([str(path)], ["DIMS = 16"])
  message = str(info.value)
  assert "'DIMS = 16' sets the macro DIMS" in message
  assert "Did you mean 'DIM'?" in message and "['DIM']" in message
  # Used by an included file, or only by another binding: accepted.
  gin.clear_config()
  config.parse([str(path)], ["DIM = 16"])
  assert gin.query_parameter("DIM/macro.value") == 16
  gin.clear_config()
  config.parse([str(path)], ["WIDTH = 4", "EmbeddingSettings.dim = %WIDTH"])
  assert gin.query_parameter("WIDTH/macro.value") == 4


def test_unclosed_bracket_in_a_binding(tmp_path):
  path = tmp_path / "ok.gin"
  path.write_text("EmbeddingSettings.dim = 8\n")
  with pytest.raises(
    config.GinConfigError, match=r"unclosed bracket.*dims = \(1,"
  ):
    config.parse([str(path)], ["EmbeddingSettings.dims = (1,"])


@pytest.mark.parametrize(
  "line,unknown,suggestion",
  [
    ("SyntheticCTRR.num_dense = 3", "'SyntheticCTRR'", "'SyntheticCTR'"),
    (
      "train.embedding_optimizer = @embedding.Adagard()",
      "'@embedding.Adagard()'",
      "'embedding.Adagrad'",
    ),
    (
      "train.embedding_optimizer = @embedding.adam()",
      "'@embedding.adam()'",
      "'embedding.Adam'",
    ),
    (
      "train.dense_optimizer = @keras.optimizers.Adamm",
      "'@keras.optimizers.Adamm'",
      "'keras.optimizers.Adam'",
    ),
    ("train.model = @DLMR", "'@DLMR'", "'DLRM'"),
  ],
)
def test_misspelt_configurable_suggests_the_closest_name(
  tmp_path, line, unknown, suggestion
):
  message = parse_error(tmp_path, f"EmbeddingSettings.dim = 8\n{line}\n")
  assert (
    "No configurable matching "
    f"{'reference ' if '@' in unknown else ''}{unknown}" in message
  )
  assert "Did you mean" in message and suggestion in message
  assert str(tmp_path / "bad.gin") in message and "line 2" in message


@pytest.mark.parametrize(
  "line,suggestion",
  [
    ("embedding.Adagrad.learnin_rate = 0.1", "'learning_rate'"),
    ("train.backned = 'tensorcore'", "'backend'"),
    ("EmbeddingSettings.combinr = 'sum'", "'combiner'"),
  ],
)
def test_misspelt_parameter_suggests_and_lists_parameters(
  tmp_path, line, suggestion
):
  message = parse_error(tmp_path, line + "\n")
  assert "doesn't have a parameter named" in message
  assert f"Did you mean {suggestion}?" in message
  assert (
    "takes:" in message and suggestion.strip("'") in message.split("takes:")[1]
  )


def test_misspelt_backend_name_suggests_the_closest(tmp_path):
  with pytest.raises(
    backends.UnknownBackendError,
    match=r"unknown embedding backend 'tensorcor'; did you mean "
    r"'tensorcore'\? available: .*tensorcore",
  ):
    backends.create(
      {"f": E.FeatureConfig(E.TableConfig(23, 7, name="t"))},
      E.SGD(0.1),
      backend="tensorcor",
    )


# -- embedding optimizers ------------------------------------------------------


@pytest.mark.parametrize(
  "binding,match",
  [
    (
      "EmbeddingSettings.optimizer = @embedding.Adagrad",
      r"EmbeddingSettings.optimizer is the class Adagrad, not an optimizer: "
      r"in gin "
      r"write @embedding.Adagrad\(\) with parentheses",
    ),
    (
      "EmbeddingSettings.optimizer = @keras.optimizers.Adam()",
      r"EmbeddingSettings.optimizer is a .*Adam \(a Keras optimizer.*"
      r"train.dense_optimizer\).*@embedding.Adam\(\)",
    ),
    (
      "EmbeddingSettings.optimizer = 'adagrad'",
      r"= 'adagrad' is a string.*Did you mean 'Adagrad'\?",
    ),
    (
      "EmbeddingSettings.overrides = {'item': {'optimizer': @embedding.FTRL}}",
      r"EmbeddingSettings.overrides\['item'\]\['optimizer'\] "
      r"is the class FTRL.*"
      r"@embedding.FTRL\(\) with parentheses",
    ),
    (
      "EmbeddingSettings.optimizer = @embedding.SGD()\n"
      "embedding.SGD.learning_rate = -0.1",
      r"embedding.SGD.learning_rate must be >= 0 \(0: frozen\), got -0.1",
    ),
    (
      "EmbeddingSettings.optimizer = @embedding.Adam()\n"
      "embedding.Adam.learning_rate = 'fast'",
      r"embedding.Adam.learning_rate must be >= 0 .*got 'fast'",
    ),
  ],
)
def test_embedding_optimizer_mistakes_are_explained(tmp_path, binding, match):
  with pytest.raises(SettingsError, match=match):
    configured_feature_config(tmp_path, binding + "\n")


@pytest.mark.parametrize(
  "optimizer,match",
  [
    (E.Adagrad, r"train.embedding_optimizer is the class Adagrad.*parentheses"),
    (E.SGD(-0.1), r"train.embedding_optimizer: SGD.learning_rate = -0.1"),
  ],
  ids=["class", "negative_learning_rate"],
)
def test_trainer_checks_its_embedding_optimizer(tmp_path, optimizer, match):
  from recsys.models import DLRM  # pylint: disable=g-import-not-at-top
  from recsys.training import Trainer  # pylint: disable=g-import-not-at-top
  from tests.training.sources import ArraySource  # pylint: disable=g-import-not-at-top

  with pytest.raises(FeatureConfigError, match=match):
    Trainer(
      str(tmp_path),
      ArraySource(),
      functools.partial(DLRM, bottom_mlp=(11, 7)),
      embedding=EmbeddingSettings(dim=7),
      embedding_optimizer=optimizer,
      global_batch_size=10,
      train_steps=1,
      progress_bar=False,
      summaries=False,
    ).train()


def test_a_learning_rate_schedule_is_accepted(tmp_path):
  config = configured_feature_config(
    tmp_path,
    "EmbeddingSettings.optimizer = @embedding.SGD()\n"
    "embedding.SGD.learning_rate = "
    "@keras.optimizers.schedules.PolynomialDecay()\n"
    "keras.optimizers.schedules.PolynomialDecay.initial_learning_rate = 0.1\n"
    "keras.optimizers.schedules.PolynomialDecay.decay_steps = 10\n",
  )
  assert isinstance(config["user"].table.optimizer, E.SGD)


# -- tables shared with conflicting settings -----------------------------------


def test_override_of_a_feature_in_a_shared_table_names_the_table(tmp_path):
  with pytest.raises(
    FeatureConfigError,
    match=r"'history' is a feature of the shared table 'item' "
    r"\(with \['item', 'history'\]\).*override the table: 'item'",
  ):
    configured_feature_config(
      tmp_path, "EmbeddingSettings.overrides = {'history': {'dim': 5}}\n"
    )


def test_misspelt_override_table_and_combiner_suggest_the_closest(tmp_path):
  with pytest.raises(
    FeatureConfigError,
    match=r"unknown tables \['itme'\].*Did you "
    r"mean 'item'\?",
  ):
    configured_feature_config(
      tmp_path, "EmbeddingSettings.overrides = {'itme': {'dim': 5}}\n"
    )
  gin.clear_config()
  with pytest.raises(
    SettingsError, match=r"got 'sqrt'\. Did you mean 'sqrtn'\?"
  ):
    configured_feature_config(tmp_path, "EmbeddingSettings.combiner = 'sqrt'\n")


GIN_TABLES = """
users/embedding.TableConfig.vocabulary_size = 23
users/embedding.TableConfig.dim = 7
users/embedding.TableConfig.name = 'users'
other/embedding.TableConfig.vocabulary_size = 23
other/embedding.TableConfig.dim = 11
other/embedding.TableConfig.name = 'users'
a/embedding.FeatureConfig.table = %TABLE_A
b/embedding.FeatureConfig.table = %TABLE_B
FEATURES = {
    'a': @a/embedding.FeatureConfig(),
    'b': @b/embedding.FeatureConfig(),
}
"""


def _gin_features(tmp_path, table_a, table_b):
  parse(tmp_path, GIN_TABLES + f"TABLE_A = {table_a}\nTABLE_B = {table_b}\n")
  return gin.query_parameter("FEATURES/macro.value")


def _evaluate(value):
  if isinstance(value, dict):
    return {k: _evaluate(v) for k, v in value.items()}
  return gin_compat.evaluate(value)


def test_gin_tables_with_one_name_and_two_settings_are_refused(tmp_path):
  features = _evaluate(
    _gin_features(
      tmp_path,
      "@users/embedding.TableConfig()",
      "@other/embedding.TableConfig()",
    )
  )
  with pytest.raises(
    ValueError,
    match=r"two different TableConfig objects are both "
    r"named 'users'.*share one TableConfig object",
  ):
    backends.create(features, E.SGD(0.1), backend="tensorcore")


def test_a_gin_singleton_shares_one_table(tmp_path):
  parse(
    tmp_path,
    GIN_TABLES
    + (
      "users/gin.singleton.constructor = @users/embedding.TableConfig\n"
      "TABLE_A = @users/gin.singleton()\nTABLE_B = @users/gin.singleton()\n"
    ),
  )
  features = _evaluate(gin.query_parameter("FEATURES/macro.value"))
  assert features["a"].table is features["b"].table
  emb = backends.create(features, E.SGD(0.1), backend="tensorcore")
  assert [emb.table_name(t) for t in emb.tables] == ["users"]


# -- end to end: `recsys train` ------------------------------------------------

TINY = """include 'base.gin'
train.data = @SyntheticCTR()
SyntheticCTR.num_dense = 3
SyntheticCTR.vocab_sizes = (23, 29)
SyntheticCTR.multi_hot_sizes = (1, 3)
SyntheticCTR.oracle_examples = 2048
SyntheticCTR.num_eval_examples = 64
train.model = @DLRM
DLRM.bottom_mlp = (8, 7)
DLRM.top_mlp = (8,)
EmbeddingSettings.dim = 7
train.global_batch_size = 16
train.train_steps = 2
train.steps_per_loop = 1
train.eval_steps = 1
train.progress_bar = False
train.summaries = False
"""


def run_recsys(tmp_path, capsys, extra):
  """`recsys train` on TINY + `extra`: (exit status, stderr), gin path.

  In this process (`recsys.cli.main`, what the console script calls): the
  fresh-process path of the command is tests/test_cli.py's.
  """
  path = tmp_path / "run.gin"
  path.write_text(TINY + extra)
  code = cli.main(
    ["train", "--gin_file", str(path), "--model_dir", str(tmp_path / "model")]
  )
  gin.clear_config()
  return (code, capsys.readouterr().err), str(path)


def test_recsys_train_with_a_misspelt_backend(tmp_path, capsys):
  (code, err), _ = run_recsys(
    tmp_path, capsys, "train.backend = 'tensor_core'\n"
  )
  assert code == 2, err[-2000:]  # a configuration error, as gin's
  assert "did you mean 'tensorcore'?" in err
  assert "Traceback" not in err and "In call to configurable" not in err


def test_recsys_train_with_a_gin_syntax_error(tmp_path, capsys):
  (code, err), path = run_recsys(tmp_path, capsys, "train.train_steps = (2\n")
  assert code == 2, err[-2000:]
  assert "gin syntax error" in err or "unclosed bracket" in err
  assert "Traceback" not in err
