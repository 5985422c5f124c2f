"""Issue 56, item 8: `decoder.generate`'s default run spent minutes calibrating, judged the
calibration implausible and not kept, and then printed a speedup predicted from it. A
calibration that is not kept is not used: the run says in one line that it predicts nothing
and why, and decodes with the checkpoint's default tree; the default run measures no
calibration (a kept one serves), so it takes seconds."""

import json

import pytest

import decoder.tree_calibration as tree_calibration_module
from decoder import generate, measure
from decoder.calibration_cache import calibration_for
from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.tree import resolve_tree
from perfmodel.cli import run
from tests.test_defects_decoder import Calls, write_cache

# generate's calibration key for a short prompt and 8 new tokens is test_defects_decoder's (b1-s16-n8)
GENERATE = ["--prompt", "def f(", "--max-new-tokens", "8"]


@pytest.fixture(scope="module")
def bundled():
    ckpt = load_checkpoint("bundled")
    return ckpt, Decoder(ckpt)


def stand_ins(monkeypatch, plain_s: float, probe_s: float) -> Calls:
    """A calibration (plain step `plain_s`, rising with the tree) and a probe of fixed times:
    the rule under test, not this machine's load."""
    calls = Calls(plain_s)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    monkeypatch.setattr(tree_calibration_module, "probe_plain_step", lambda *_: probe_s)
    return calls


def default_size(ckpt) -> int:
    return resolve_tree("default", ckpt).size


def test_a_calibration_that_is_not_kept_predicts_nothing(bundled, monkeypatch, capsys):
    ckpt, decoder = bundled
    calls = stand_ins(monkeypatch, 5e-3, 1e-3)  # the machine slowed 5x while it calibrated
    assert run(generate.main, [*GENERATE, "--tree", "auto"]) == 0
    err = capsys.readouterr().err
    # measured twice (a burst of load spoils one), both implausible: neither kept nor used
    assert calls.count == tree_calibration_module.CALIBRATION_ATTEMPTS == 2
    assert "measuring it once more" in err and "neither kept nor used" in err
    assert "predicted" not in err.replace("no speedup predicted", "")
    said = [line for line in err.splitlines() if line.startswith("no speedup predicted")]
    assert len(said) == 1 and "implausible" in said[0] and f"default tree of {default_size(ckpt)} tokens" in said[0]
    assert err.rstrip().endswith(f"tree of {default_size(ckpt)} tokens]")
    assert not calibration_for(ckpt, decoder, 1, 16, 8).path.exists()


def test_the_default_run_measures_no_calibration_and_decodes_the_same_tokens(monkeypatch, capsys):
    calls = stand_ins(monkeypatch, 1e-3, 1e-3)
    argv = ["--prompt", "def parse_args(argv):", "--max-new-tokens", "24"]
    assert run(generate.main, argv) == 0
    out, err = capsys.readouterr()
    assert calls.count == 0 and "calibrating" not in err
    said = [line for line in err.splitlines() if "predicted" in line]
    assert said == [
        "no speedup predicted: no calibration of this machine's step times is kept (--tree auto measures one and "
        f"keeps it); running the checkpoint's default tree of {default_size(load_checkpoint('bundled'))} tokens"
    ]
    assert err.splitlines()[-1].startswith("[measured: 24 tokens in ")  # the run's own counts, said so
    assert run(generate.main, [*argv, "--no-medusa"]) == 0
    assert capsys.readouterr().out == out  # greedy: the tree changes the steps, not the text


def test_the_default_run_takes_its_tree_from_a_kept_calibration_and_names_it(bundled, monkeypatch, capsys):
    ckpt, decoder = bundled
    calls = stand_ins(monkeypatch, 1e-3, 1e-3)
    write_cache(ckpt, decoder, {1: 1e-3, 2: 2e-3, 4: 2.2e-3})
    assert run(generate.main, GENERATE) == 0
    err = capsys.readouterr().err
    path = calibration_for(ckpt, decoder, 1, 16, 8).path
    assert calls.count == 0 and f"using the tree calibration {path}" in err
    said = [line for line in err.splitlines() if line.startswith("--tree auto: ")]
    assert len(said) == 1 and said[0].endswith(f"[this decoder's measured step times, b1-s16-n8, {path}]")


def test_the_default_run_does_not_measure_again_a_kept_calibration_that_does_not_fit(bundled, monkeypatch, capsys):
    ckpt, decoder = bundled
    calls = stand_ins(monkeypatch, 1e-3, 0.5e-3)  # the kept plain step is 2x this machine's now
    write_cache(ckpt, decoder, {1: 1e-3, 2: 2e-3, 4: 2.2e-3})
    assert run(generate.main, GENERATE) == 0
    err = capsys.readouterr().err
    assert calls.count == 0 and "not using the tree calibration" in err and "--tree auto: " not in err
    assert "no speedup predicted: the kept calibration does not fit this machine now" in err
    assert err.rstrip().endswith(f"tree of {default_size(ckpt)} tokens]")


def test_recalibrate_without_a_tree_still_measures(bundled, monkeypatch, capsys):
    ckpt, decoder = bundled
    calls = stand_ins(monkeypatch, 1e-3, 1e-3)
    assert run(generate.main, [*GENERATE, "--recalibrate"]) == 0
    err = capsys.readouterr().err
    assert calls.count == 1 and "kept the tree calibration" in err and "--tree auto: " in err


def test_measure_records_no_choice_from_a_calibration_that_is_not_kept(bundled, monkeypatch, tmp_path, capsys):
    ckpt, _ = bundled
    stand_ins(monkeypatch, 5e-3, 1e-3)
    out = tmp_path / "acc.json"
    args = ["--prompts", "1", "--prompt-len", "16", "--new-tokens", "8", "--sizes", "1", "--tree", "auto"]
    assert run(measure.main, [*args, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["auto"] is None
    assert record["tree"]["name"] == "default" and record["tree"]["size"] == default_size(ckpt)
    assert "--tree auto: " not in capsys.readouterr().err


def test_a_second_calibration_that_is_plausible_is_kept_and_chooses(bundled, monkeypatch, capsys):
    """Issue 57: a --tree auto run whose first calibration a burst of load spoiled decoded the
    default tree at batch 4 (x0.40 of plain decoding); it measures once more instead."""
    ckpt, decoder = bundled

    class SpoiledOnce(Calls):
        def __call__(self, *args, **kwargs):
            self.plain_s = 5e-3 if self.count == 0 else 1e-3  # the first under a 5x slower machine
            return super().__call__(*args, **kwargs)

    calls = SpoiledOnce(1e-3)
    monkeypatch.setattr(tree_calibration_module, "calibrate", calls)
    monkeypatch.setattr(tree_calibration_module, "probe_plain_step", lambda *_: 1e-3)
    assert run(generate.main, [*GENERATE, "--tree", "auto", "--recalibrate"]) == 0
    err = capsys.readouterr().err
    assert calls.count == 2 and "measuring it once more" in err and "kept the tree calibration" in err
    assert "no speedup predicted" not in err
    assert calibration_for(ckpt, decoder, 1, 16, 8).path.exists()
