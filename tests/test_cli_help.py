"""Training never writes over the shipped model unless asked to. (Every command's --help and
options are walked by tests/test_cli_options.py, which finds the commands itself.)"""

from __future__ import annotations

from pathlib import Path

import pytest


def test_training_writes_a_work_folder_unless_installing():
    from decoder.checkpoint import BUNDLED
    from decoder.train import build_parser

    parser = build_parser()
    assert parser.parse_args([]).out == Path("perf-reports") / "trained" and not parser.parse_args([]).install
    assert parser.parse_args(["--install"]).install
    with pytest.raises(SystemExit):
        parser.parse_args(["--install", "--out", str(BUNDLED)])  # one or the other


def test_model_is_only_for_medusa2(capsys):
    from decoder.train import main

    with pytest.raises(SystemExit) as exit_:
        main(["--model", "bundled"])
    assert (
        exit_.value.code == 2
        and "--model picks the checkpoint --medusa2, --eagle or --draft-model starts from" in capsys.readouterr().err
    )
