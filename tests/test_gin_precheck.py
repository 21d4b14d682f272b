"""Misspelt gin names are found before TensorFlow starts (issue 52).

A misspelt parameter (`--gin_bindings 'train.train_stepz = 5'`) took 15-19
s and 27 lines, its "Did you mean" scrolled away by 20 "Found in:" lines.
`recsys.gin_config.precheck` reads the files and bindings with gin's parser and
checks them against `recsys.gin_config.names`, the registry written down: that
file must be the registry, and no shipped experiment may be refused.
(That the command reports it without importing TensorFlow, with status 2:
tests/test_first_contact.py, in a fresh process.)
"""

import pytest

from recsys import cli, config, experiments_catalog
from recsys.gin_config import names as gin_names
from recsys.gin_config import precheck as gin_precheck
from recsys.tools import gin_names as gin_names_tool


def test_the_written_down_names_are_the_registry():
  assert gin_names.CONFIGURABLES == gin_names_tool.registered(), (
    "recsys/gin_config/names.py is stale: run python -m recsys.tools.gin_names"
  )


def test_no_shipped_experiment_is_refused():
  for experiment in experiments_catalog.list_experiments():
    assert gin_precheck.problems([experiment.path], []) == [], experiment.name


def test_a_misspelt_binding_is_named_with_what_was_meant_in_two_lines():
  found = gin_precheck.problems(
    ["synthetic_dlrm.gin"], ["train.train_stepz = 5"]
  )
  assert len(found) == 1
  first, second = found[0].splitlines()
  assert first == (
    "--gin_bindings 'train.train_stepz = 5': 'train' has no parameter "
    "'train_stepz'; did you mean 'train_steps'?"
  )
  assert second.startswith("'train' takes: model_dir, data, model,")


def test_a_misspelt_parameter_in_an_included_file_names_its_line(tmp_path):
  (tmp_path / "mine.gin").write_text(
    "include 'synthetic_dlrm.gin'\n\n# a comment\nDLRM.top_mpl = (64, 32)\n"
  )
  outer = tmp_path / "outer.gin"
  outer.write_text("include 'mine.gin'\n")
  found = gin_precheck.problems([str(outer)], [])
  assert [f.splitlines()[0] for f in found] == [
    f"{tmp_path / 'mine.gin'}:4: 'DLRM' has no parameter 'top_mpl'; did "
    "you mean 'top_mlp'?"
  ]


def test_a_misspelt_reference_or_configurable_is_named():
  found = gin_precheck.problems(
    ["synthetic_dlrm.gin"],
    ["train.model = @DLMR", "SyntheticCTRR.seed = 1"],
  )
  assert [f.splitlines()[0] for f in found] == [
    "--gin_bindings 'train.model = @DLMR': no configurable named 'DLMR'; "
    "did you mean 'DLRM'?",
    "--gin_bindings 'SyntheticCTRR.seed = 1': no configurable named "
    "'SyntheticCTRR'; did you mean 'SyntheticCTR' or 'SyntheticRetrieval'?",
  ]


def test_what_only_gin_can_judge_is_left_to_it(tmp_path):
  """A file importing a module may register names; TF's classes follow the
  installed TF. (A selector matching several names is refused here:
  tests/test_setting_refusals.py.)"""
  mine = tmp_path / "mine.gin"
  mine.write_text("import my_package.models\ntrain.model = @MyModel\n")
  assert gin_precheck.problems([str(mine)], []) == []
  assert (
    gin_precheck.problems(
      ["synthetic_dlrm.gin"],
      ["embedding.Adagrad.learnin_rate = 0.1"],
    )
    == []
  )


def test_the_model_kind_is_read_without_tensorflow():
  assert gin_precheck.model_kind(["synthetic_dcn.gin"], []) == (
    "DCNv2",
    "ranking",
  )
  assert gin_precheck.model_kind(
    ["synthetic_dcn.gin"], ["train.model = @TwoTower"]
  ) == ("TwoTower", "retrieval")


@pytest.mark.parametrize(
  "argv",
  [
    ["info", "--gin_file", "synthetic_dlrm.gin"],
    ["train", "--model_dir", "unused", "--gin_file", "synthetic_dlrm.gin"],
  ],
)
def test_the_commands_refuse_it_with_status_2_in_two_lines(argv, capsys):
  code = cli.main(argv + ["--gin_bindings", "train.train_stepz = 5"])
  err = capsys.readouterr().err
  assert code == 2, err
  command = argv[0]
  assert err.splitlines()[0] == (
    f"recsys {command}: gin configuration error: --gin_bindings "
    "'train.train_stepz = 5': 'train' has no parameter 'train_stepz'; did "
    "you mean 'train_steps'?"
  )
  assert len(err.splitlines()) == 2


def test_gins_own_error_names_the_binding_not_every_line_of_train():
  """After start-up (a name only gin knows): no 20 "Found in:" lines."""
  with pytest.raises(config.GinConfigError) as e:
    config.parse(
      [experiments_catalog.find_experiment("synthetic_dlrm.gin")],
      ["embedding.Adagrad.learnin_rate = 0.1"],
    )
  message = str(e.value)
  assert "Did you mean 'learning_rate'?" in message
  assert "Found in:" not in message and len(message.splitlines()) <= 5
