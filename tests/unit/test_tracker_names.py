"""``--tracker``: the names it takes, the older ``--tensorboard false``, and the one-line
refusals (an unknown tracker, ``none`` with another, a tracker whose package is missing)."""

import sys

import pytest

from tests.support.runs import one_line_error
from trainers import ddp
from trainers.config.parsing import parse_config
from trainers.errors import ConfigError
from trainers.options.tracker_names import check_trackers, chosen_trackers


@pytest.mark.parametrize(("tracker", "tensorboard", "chosen"), [
    ("tensorboard", True, ("tensorboard",)),
    ("mlflow, wandb,mlflow", True, ("mlflow", "wandb")),
    ("tensorboard,mlflow", False, ("mlflow",)),
    ("tensorboard", False, ()),
    ("none", True, ()),
])
def test_chosen_trackers(tracker, tensorboard, chosen):
    assert chosen_trackers(tracker, tensorboard) == chosen


def test_the_parser_takes_tracker_and_the_older_tensorboard_flag():
    cfg = parse_config(["--tracker", "mlflow,tensorboard", "--tensorboard", "false"], "ddp",
                       check_paths=False)
    assert chosen_trackers(cfg.tracker, cfg.tensorboard) == ("mlflow",)
    default = parse_config([], "ddp", check_paths=False).tracker
    assert (default, type(default)) == ("tensorboard", str)
    repeated = parse_config(["--tracker", "tensorboard", "--tracker", "wandb,mlflow"], "ddp",
                            check_paths=False)
    assert chosen_trackers(repeated.tracker) == ("tensorboard", "wandb", "mlflow")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--tracker", "comet"], "--tracker comet is not a tracker; pick from tensorboard, "
                             "mlflow, wandb or none (comma-separated)"),
    (["--tracker", "none,mlflow"], "--tracker none,mlflow: none cannot be combined with "
                                   "another tracker; drop none or the others"),
])
def test_bad_tracker_is_one_line(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit_info:
        ddp.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_a_missing_package_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets uninstalled
    assert "pip install 'torchx-templates[wandb]'" in one_line_error(
        capsys, ddp, "--tracker", "wandb", "--output-dir", str(tmp_path))
    assert not list(tmp_path.iterdir())  # refused before anything was written
    with pytest.raises(ConfigError, match=r"^--tracker wandb needs the wandb package, which is "
                       r"not installed: pip install 'torchx-templates\[wandb\]' \(or drop "
                       r"wandb from --tracker\)$"):
        check_trackers("tensorboard,wandb", True, packages=True)
    check_trackers("tensorboard,wandb", True, packages=False)  # a submit machine need not have it
