"""The installed package: a wheel in a fresh venv, used from another folder.

The wheel must carry the experiment gin files; a user's own gin file outside
the repo includes a shipped experiment by name, and `include` resolves
relative to the including file first.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# No PYTHONPATH: the repo (or a worktree) on it would shadow the wheel.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args, cwd, env=None, timeout=600):
  done = subprocess.run(
    args,
    cwd=cwd,
    env=env or CLEAN_ENV,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-3000:])
  return done


@pytest.mark.slow  # ~40 s: builds a wheel, makes a venv, trains 4 steps
def test_wheel_in_a_fresh_venv_trains_a_users_gin_file_from_elsewhere(tmp_path):
  wheels, venv, work = tmp_path / "wheels", tmp_path / "venv", tmp_path / "work"
  # Built from a copy: the build leaves build/ and *.egg-info behind.
  src = tmp_path / "src"
  anywhere = shutil.ignore_patterns("*.egg-info", "__pycache__")
  top_level = {
    ".git",
    ".venv",
    "runs",
    "data",
    "build",
    ".pytest_cache",
    ".hypothesis",
  }
  shutil.copytree(
    ROOT,
    src,
    symlinks=True,
    ignore=lambda d, names: (
      set(anywhere(d, names)) | (top_level & set(names) if d == ROOT else set())
    ),
  )
  _run(
    [
      sys.executable,
      "-m",
      "pip",
      "wheel",
      "--no-deps",
      "-q",
      "-w",
      str(wheels),
      str(src),
    ],
    cwd=tmp_path,
  )
  _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
  python = venv / "bin" / "python"
  wheel = next(wheels.glob("recsys-*.whl"))
  _run(
    [
      sys.executable,
      "-m",
      "pip",
      "--python",
      str(python),
      "install",
      "--no-deps",
      "--no-index",
      "-q",
      str(wheel),
    ],
    cwd=tmp_path,
  )
  # Dependencies (TensorFlow, ...) then come from this environment, by path:
  # no download, and no editable install of the repo (its .pth is not run).
  site = _run(
    [
      str(python),
      "-c",
      "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ],
    cwd=tmp_path,
  ).stdout.strip()
  with open(
    os.path.join(site, "deps_from_test_env.pth"), "w", encoding="utf-8"
  ) as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")

  env = dict(CLEAN_ENV, TF_CPP_MIN_LOG_LEVEL="3", RECSYS_FUSED_KERNELS="0")
  recsys = str(venv / "bin" / "recsys")
  work.mkdir()
  where = _run(
    [str(python), "-c", "import recsys; print(recsys.__file__)"],
    cwd=work,
    env=env,
  )
  assert where.stdout.startswith(site), where.stdout

  listed = _run([recsys, "experiments"], cwd=work, env=env).stdout
  for name in ("synthetic_dlrm.gin", "base.gin", "hardware/cpu_small.gin"):
    assert name in listed
  printed = _run(
    [recsys, "experiments", "synthetic_dlrm.gin"], cwd=work, env=env
  ).stdout
  assert "include 'base.gin'" in printed

  # The user's files live elsewhere; cfg/sub/tiny.gin includes its sibling.
  (tmp_path / "cfg" / "sub").mkdir(parents=True)
  (tmp_path / "cfg" / "my.gin").write_text(
    "include 'synthetic_dlrm.gin'\ninclude 'sub/tiny.gin'\n"
  )
  (tmp_path / "cfg" / "sub" / "tiny.gin").write_text(
    "include 'steps.gin'\n"
    + textwrap.dedent("""
      train.global_batch_size = 32
      train.eval_steps = 2
      train.summaries = False
      SyntheticCTR.oracle_examples = 2048
      """)
  )
  (tmp_path / "cfg" / "sub" / "steps.gin").write_text(
    "train.train_steps = 4\ntrain.steps_per_loop = 2\n"
  )
  _run(
    [
      recsys,
      "train",
      "--gin_file",
      "../cfg/my.gin",
      "--model_dir",
      "run",
      "--no_progress",
    ],
    cwd=work,
    env=env,
  )
  metrics = json.loads((work / "run" / "metrics.json").read_text())
  assert metrics["step"] == 4 and metrics["global_batch_size"] == 32
