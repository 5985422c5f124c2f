"""Issue #42: output kept whole on a full disk, outputs checked before the work, no silent
answers, no tracebacks, a calibration a busy machine cannot spoil, pages that agree with
themselves. Each test fails on the main before the fix."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

import decoder.tree_calibration as tree_calibration_module
from decoder import generate
from decoder.auto_tree import auto_tree
from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.step_profile import costly_trees
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import replaced_atomically
from perfmodel.cli import run
from perfmodel.hardware.specs import load_spec_file
from perfmodel.models.config import ModelConfig, load_model
from perfmodel.planning.result import PlanResult
from perfmodel.schedule import main as schedule_main
from profilers.sweep import main as sweep_main
from reports.__main__ import main as reports_main
from reports.commands.plan import main as plan_main
from reports.commands.roofline import main as roofline_main
from reports.commands.speedup import main as speedup_main
from reports.commands.validate import main as validate_main
from reports.prose import capacity_fact

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "hw_specs" / "a100-sxm.yaml"


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


def refused_at_parse(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return one_line(capsys)


# --------------------------------------------------------------------------- item 1


def test_a_failed_roofline_run_leaves_the_last_one_whole(tmp_path, capsys, monkeypatch):
    out = tmp_path / "roofline"
    args = ["--gpu", "a100", "--model", "llama-7b", "--batch", "1", "--seq", "128", "--jobs", "1", "--out", str(out)]
    assert run(roofline_main, args) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "roofline.csv" in before and "roofline.html" in before

    def disk_full(*_, **__):
        raise OSError(28, "No space left on device", str(out / "roofline.html"))

    monkeypatch.setattr("reports.commands.roofline.write_page", disk_full)
    capsys.readouterr()
    assert run(roofline_main, [*args[:-2], "--seq", "256", "--out", str(out)]) == 1
    assert "No space left on device" in one_line(capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing truncated, nothing new


def test_a_table_written_over_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("old\n")
    with pytest.raises(OSError), replaced_atomically(path) as temporary:
        temporary.write_text("half a new tab")
        raise OSError(28, "No space left on device")
    assert path.read_text() == "old\n" and list(tmp_path.iterdir()) == [path]


# --------------------------------------------------------------------------- item 2


def test_outputs_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "folder"
    folder.mkdir()
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    long_name = tmp_path / ("x" * 300)
    assert "is a folder" in refused_at_parse(speedup_main, ["--gpu", "a100", "--csv", str(folder)], capsys)
    assert "is a file" in refused_at_parse(schedule_main, ["--gpu", "a100", "--out", str(a_file)], capsys)
    for main, argv in (
        (roofline_main, ["--gpu", "a100", "--out", str(long_name)]),
        (reports_main, ["build", "--gpu", "a100", "--out", str(long_name)]),
        (sweep_main, ["--device", "cpu", "--model", "bundled", "--out", f"{long_name}.csv"]),
    ):
        assert "is a name of 30" in refused_at_parse(main, argv, capsys)
    deep = tmp_path / "/".join(["d" * 200] * 21)
    assert "is a path of" in refused_at_parse(roofline_main, ["--gpu", "a100", "--out", str(deep)], capsys)
    # a read-only folder (the suite may run as root, who writes anywhere: its answer is faked)
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    started = time.perf_counter()
    err = refused_at_parse(validate_main, ["--csv", str(locked / "v.csv")], capsys)
    assert "not writable" in err and time.perf_counter() - started < 10  # before 37 s of measuring


# --------------------------------------------------------------------------- item 3


def test_no_silent_answer_past_the_models_context(capsys):
    args = ["--gpu", "a100", "--model", "llama-7b", "--tree-size", "64", "--acceleration", "3.0", "--batch", "1"]
    assert run(speedup_main, [*args, "--context", "16777216"]) == 1
    assert "exceed llama-7b's context of 2048 tokens" in one_line(capsys)


def test_a_rate_too_low_to_simulate_is_refused(capsys):
    args = ["--model", "llama-7b", "--gpu", "a100", "--prompt-len", "512", "--response-len", "128"]
    assert run(plan_main, [*args, "--rate", "1e-300"]) == 1
    assert "too low to simulate" in one_line(capsys)


def test_a_record_whose_acceptance_falls_as_the_tree_grows_is_refused(tmp_path):
    runs = [{"tree_size": n, "mean_accepted_tokens": m} for n, m in ((1, 1.0), (4, 2.2), (16, 1.4), (64, 2.0))]
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"per_tree_size": runs, "head_topk_accuracy": [[0.5, 0.2]]}))
    with pytest.raises(PerfkitError, match="fall from 2.2 at tree size 4 to 1.4 at 16"):
        AcceptanceRecord.load(path)


# --------------------------------------------------------------------------- items 4 and 5


def test_a_yaml_bomb_in_a_spec_is_refused_before_it_is_built(tmp_path):
    lines = [*SPEC.read_text().splitlines(), "x0: &x0 [a, a, a, a, a, a, a, a, a]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, 10)]
    lines = [line for line in lines if not line.startswith("aliases:")] + ["aliases: [*x9]"]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    with pytest.raises(PerfkitError, match="anchors and aliases"):
        load_spec_file(bomb)
    assert time.perf_counter() - started < 10


def test_a_spec_that_is_not_utf8_is_one_line(tmp_path, capsys):
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(SPEC.read_bytes().replace(b"name: ", "name: caf\u00e9 ".encode("latin-1"), 1))
    assert run(roofline_main, ["--spec", str(spec), "--model", "llama-7b", "--out", str(tmp_path / "o")]) == 1
    assert "not UTF-8 text (byte 0xe9" in one_line(capsys)


def test_a_config_past_what_the_arithmetic_holds_is_one_line(tmp_path, capsys):
    config = {
        "vocab_size": 32000,
        "hidden_size": 2**40,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run(speedup_main, ["--gpu", "a100", "--model", str(path), "--out", str(tmp_path / "o")]) == 1
    assert "hidden_size must be an integer from 1 to 1,048,576" in one_line(capsys)
    with pytest.raises(PerfkitError, match="max_context must be at most"):
        ModelConfig("m", 64, 64, 4, 4, 2, 100, 16, max_context=2**30)


def test_decoder_inputs_that_are_not_numbers_or_text_are_one_line(capsys):
    assert "must be a number > 0, got 'nan'" in refused_at_parse(
        generate.main, ["--prompt", "hi", "--temperature", "nan"], capsys
    )
    assert run(generate.main, ["--prompt", "ab\udcff", "--max-new-tokens", "2", "--no-medusa"]) == 1
    assert "--prompt is not UTF-8 text (byte 0xff" in one_line(capsys)


# --------------------------------------------------------------------------- item 6


def test_a_tree_step_over_n_plus_one_plain_steps_is_not_kept():
    assert costly_trees({1: 1e-3, 2: 5e-3, 4: 5.2e-3}).startswith("a step of 2 tokens took 5 ms, more than 3 plain")
    assert costly_trees({1: 1e-3, 2: 1.7e-3, 64: 3.8e-3}) is None


def test_a_refused_calibration_names_no_cache_file_and_the_calibration_is_short(monkeypatch, tmp_path):
    monkeypatch.setenv("MEDUSA_PERFKIT_HOME", str(tmp_path / "home"))
    ckpt = load_checkpoint("bundled")
    decoder = Decoder(ckpt)
    decoded = []
    real = tree_calibration_module.decode_interleaved

    def spy(decoder, prompts, batch, max_new, settings, rounds=1, **kwargs):
        decoded.append(max_new)
        result = real(decoder, prompts, batch, max_new, settings, rounds, **kwargs)
        result[2].decode_s *= 5  # a burst of load while the 2-token tree ran: 5x its real time
        return result

    monkeypatch.setattr(tree_calibration_module, "decode_interleaved", spy)
    # three tree sizes are enough for a refused calibration (the 2-token tree's burst makes its steps fall)
    monkeypatch.setattr(tree_calibration_module, "CALIBRATION_SIZES", (1, 2, 4))
    monkeypatch.setattr(tree_calibration_module, "CALIBRATION_ROUNDS", 2)  # a spread needs two; the burst is in each
    said = []
    choice, _ = auto_tree(decoder, ckpt, 1, 16, 200, log=said.append)
    assert set(decoded) == {tree_calibration_module.CALIBRATION_TOKENS}  # not the run's 200 tokens
    assert any("is neither kept nor used" in line for line in said)
    assert choice is None and not any(".json" in line for line in said)  # issue 56, item 8: nothing predicted from it


# --------------------------------------------------------------------------- item 8


def test_the_capacity_line_says_where_the_measurement_found_no_tree_paid():
    devices = pd.DataFrame(
        [
            dict(
                fits=True,
                max_batch=7224,
                kv_mb_per_seq=3.0,
                meets_latency=True,
                speculate=True,
                tree_size=2,
                batch=4096,
                per_token_ms=656.3,
                total_tokens_s=6241.0,
            )
        ]
    )
    planned = PlanResult(load_model("bundled"), "fp32", None, None, "", devices, pd.DataFrame(), pd.DataFrame())
    line = capacity_fact(planned, {1: False})
    assert "a tree of 2" in line and "no tree paid at batch 1, and at batch 4096 nothing was measured" in line


def test_the_files_the_docs_commands_write_in_the_checkout_are_ignored():
    written = ["sweep.csv", "sweep.csv.meta.json", "acc.json", "validate.csv", "eagle.csv", "fig4.csv", "campaign/x"]
    ignored = subprocess.run(
        ["git", "check-ignore", *written], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    assert sorted(ignored) == sorted(written)
