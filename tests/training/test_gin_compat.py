"""recsys.gin_config.compat against the installed gin: every internal it relies on."""

import os

import gin
import pytest

from recsys.gin_config import compat as gin_compat


@gin.configurable("compat_probe")
def probe(required_value=gin.REQUIRED, other=1):
  return required_value, other


@gin.configurable("compat_other")
def other_probe(value=2):
  return value


def test_registry_lists_and_finds_configurables():
  assert any(
    s.endswith("compat_probe") for s in gin_compat.registered_selectors()
  )
  found = gin_compat.find_configurable("compat_probe")
  assert found is not None and found.__name__ == "probe"
  assert gin_compat.find_configurable("no_such_thing_anywhere") is None


def test_evaluate_calls_references():
  gin.parse_config(
    ["compat_other.value = 3", "compat_probe.other = @compat_other()"]
  )
  # A reference with () is called; the value is what the call returns.
  value = gin_compat.evaluate(gin.query_parameter("compat_probe.other"))
  assert value == 3
  assert gin_compat.evaluate(5) == 5


def test_search_paths_are_gins_own():
  gin_compat.reset_search_paths()
  assert gin_compat.search_paths() == [""]
  gin_compat.append_search_path("/tmp/a")
  gin_compat.append_search_path("/tmp/a")
  assert gin_compat.search_paths() == ["", "/tmp/a"]
  with gin_compat.searched_first("/tmp/b"):
    assert gin_compat.search_paths()[0] == "/tmp/b"
  assert gin_compat.search_paths() == ["", "/tmp/a"]
  gin_compat.reset_search_paths()


def test_include_uses_search_paths_and_installed_reader(tmp_path):
  (tmp_path / "inc.gin").write_text("compat_probe.required_value = 7\n")
  opened = []

  def reader(path):
    opened.append(path)
    return open(path, encoding="utf-8")

  gin_compat.install_file_reader(reader, os.path.isfile)
  gin_compat.install_file_reader(reader, os.path.isfile)  # idempotent
  gin_compat.append_search_path(str(tmp_path))
  try:
    gin.parse_config("include 'inc.gin'")
    assert probe() == (7, 1)
    assert opened == [os.path.join(str(tmp_path), "inc.gin")]
  finally:
    gin_compat.reset_search_paths()


def _error(config_text: str) -> Exception:
  with pytest.raises(Exception) as e:
    gin.parse_config(config_text)
  return e.value


def test_unknown_name_and_parameter_messages():
  name = _error("compat_probe.other = @Adagard()")
  assert gin_compat.unknown_name(str(name)) == "Adagard"
  param = _error("compat_probe.othr = 1")
  assert gin_compat.unknown_parameter(str(param)) == ("compat_probe", "othr")
  assert gin_compat.unknown_name("something else") is None
  assert gin_compat.unknown_parameter("something else") is None


def test_missing_required_is_raised_by_gin_and_parsed():
  with pytest.raises(RuntimeError) as e:
    probe()
  message = str(e.value)
  assert gin_compat.missing_required(message) == (
    "compat_probe",
    ["required_value"],
  )
  assert gin_compat.names_in_message(message) == [
    "compat_probe.required_value",
    "compat_probe",
  ]
  assert gin_compat.raised_by_gin(e.value)


def test_errors_raised_inside_a_configurable_are_not_gins():
  @gin.configurable("compat_raiser")
  def raiser():
    raise RuntimeError("the model dir is busy (gin mentioned)")

  with pytest.raises(RuntimeError) as e:
    raiser()
  assert not gin_compat.raised_by_gin(e.value)


def test_names_location():
  assert gin_compat.names_location("... In file 'x.gin', line 2")
  assert not gin_compat.names_location("No configurable matching 'x'.")
