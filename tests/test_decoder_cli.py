import json

import pytest

from decoder import generate, measure, step_profile, train, training, tree_calibration
from decoder.checkpoint import load_checkpoint
from perfmodel.cli import run
from tests.conftest import quick_copy


@pytest.fixture(scope="module")
def quick_model(quick_trained, tmp_path_factory):
    """`python -m decoder.train --quick`: the whole pipeline on a tiny model (conftest trains
    it once per run; this module changes its own copy)."""
    return quick_copy(quick_trained, tmp_path_factory)


def test_training_writes_a_loadable_checkpoint_and_its_card(quick_model):
    out, _ = quick_model
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "model.safetensors",
        "medusa_lm_head.safetensors",
        "tokenizer.json",
        "medusa_tree.json",
        "training.json",
        "checksums.sha256",
    }
    ckpt = load_checkpoint(out)
    assert len(ckpt.heads) == 4 and ckpt.tree is not None and ckpt.tokenizer is not None
    card = json.loads((out / "training.json").read_text())
    assert card["backbone"]["steps"] == 30 and card["backbone"]["heldout_loss"] > 0
    assert len(card["heldout_head_accuracy"]) == 4 and len(card["heldout_head_accuracy"][0]) == 10
    assert card["corpus"]["heldout_files"] > 0 and card["corpus"]["train_files"] > card["corpus"]["heldout_files"]
    assert card["default_tree"]["nodes"] == 8


def test_training_resumes_from_its_work_folder(quick_model, tmp_path):
    _, work = quick_model
    messages = []
    config = train.QUICK
    training.build(config, tmp_path / "again", work, log=messages.append)
    assert any("resuming at step 30/30" in m for m in messages)


def test_measure_writes_every_figure(quick_model, tmp_path):
    out, _ = quick_model
    report_file = tmp_path / "acc.json"
    args = [
        "--model",
        str(out),
        "--prompts",
        "4",
        "--batch",
        "2",
        "--new-tokens",
        "24",
        "--prompt-len",
        "16",
        "--sizes",
        "1",
        "3",
        "9",
        "--tree",
        "default",  # --tree auto, the default here, is test_tree_auto_runs_the_models_choice...'s
        "--out",
        str(report_file),
    ]
    assert run(measure.main, args) == 0
    report = json.loads(report_file.read_text())
    assert report["lossless"] is True and all(row["lossless"] for row in report["per_tree_size"])
    assert report["per_tree_size"][0]["mean_accepted_tokens"] == 1.0  # a one-token tree is plain decoding
    histogram = {int(k): v for k, v in report["accepted_length_histogram"].items()}
    assert sum(k * v for k, v in histogram.items()) / sum(histogram.values()) == pytest.approx(
        report["mean_accepted_tokens"], abs=1e-4
    )
    assert len(report["head_topk_accuracy"]) == 4
    for key in ("tokens_per_s_medusa", "tokens_per_s_baseline", "step_time_split_s", "wall_speedup"):
        assert key in report
    assert set(report["step_time_split_s"]) == {"candidates", "forward", "verification", "kv_update"}


def test_measure_other_schemes_and_the_dynamic_tree(quick_model, tmp_path):
    out, _ = quick_model
    schemes = (["--acceptance", "typical", "--tree", "default"], ["--acceptance", "rejection", "--tree", "default"])
    for extra in (*schemes, ["--dynamic", "6"]):
        report_file = tmp_path / "r.json"
        assert (
            run(
                measure.main,
                [
                    "--model",
                    str(out),
                    "--prompts",
                    "2",
                    "--new-tokens",
                    "16",
                    "--prompt-len",
                    "16",
                    "--sizes",
                    "1",
                    "4",
                    "--out",
                    str(report_file),
                    *extra,
                ],
            )
            == 0
        )
        report = json.loads(report_file.read_text())
        assert report["mean_accepted_tokens"] >= 1.0


def test_generate_streams_text(quick_model, capsys):
    out, _ = quick_model
    # the checkpoint's own tree: --tree auto's calibration is the next test's
    args = ["--model", str(out), "--prompt", "def main(", "--max-new-tokens", "12", "--tree", "default"]
    assert run(generate.main, args) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("def main(") and len(captured.out) > len("def main(\n")
    assert "tokens in" in captured.err and "per step" in captured.err


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--tree", "[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)]"],
            "tree is 5 deep but the model has 4 Medusa heads",
        ),
        (["--tree", "[(0,), (12,)]"], "uses rank 12 (top-13) but candidates come from top-10"),
        (["--tree", "not a tree"], "a tree is a list of paths"),
    ],
)
def test_measure_refuses_bad_trees(quick_model, tmp_path, capsys, args, message):
    out, _ = quick_model
    assert (
        run(
            measure.main,
            ["--model", str(out), "--prompts", "1", "--new-tokens", "4", "--out", str(tmp_path / "x.json"), *args],
        )
        == 1
    )
    assert message in capsys.readouterr().err


def test_missing_checkpoint_and_empty_prompt(quick_model, tmp_path, capsys):
    out, _ = quick_model
    assert run(generate.main, ["--model", str(tmp_path / "nope"), "--prompt", "x"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert run(generate.main, ["--model", str(out), "--prompt", ""]) == 1
    assert "empty prompt" in capsys.readouterr().err


def test_tree_auto_runs_the_models_choice_and_keeps_its_calibration(quick_model, tmp_path, capsys, monkeypatch):
    out, _ = quick_model
    # Keeping and reusing is under test here, on whatever load this machine has; the plausibility checks that
    # refuse a calibration disturbed by load are tested in test_defects_decoder.py.
    for module in (tree_calibration, step_profile):
        monkeypatch.setattr(module, "PLAIN_STEP_FACTOR", float("inf"))
    monkeypatch.setattr(step_profile, "MONOTONE_SLACK", 1.0)
    monkeypatch.setattr(step_profile, "ROUND_SPREAD", float("inf"))
    monkeypatch.setattr(step_profile, "costly_trees", lambda step_s: None)
    monkeypatch.setattr(tree_calibration, "CALIBRATION_SIZES", (1, 2, 4, 8))  # the keeping under test, not the sizes
    args = ["--model", str(out), "--prompts", "4", "--batch", "2", "--new-tokens", "16", "--prompt-len", "16"]
    args += ["--sizes", "1", "3", "--tree", "auto"]
    assert run(measure.main, [*args, "--out", str(tmp_path / "first.json")]) == 0
    first = json.loads((tmp_path / "first.json").read_text())
    predicted = first["auto"]["predicted"]
    best = max(predicted, key=lambda row: (row["speedup"], -row["tree_size"]))
    assert first["auto"]["chosen_size"] == best["tree_size"] == first["tree"]["size"]
    assert first["auto"]["decodes_plainly"] == (best["tree_size"] == 1)
    assert "calibrating the decoder's step time" in capsys.readouterr().out
    # the calibration is kept per machine and model: the second run reuses it
    assert run(measure.main, [*args, "--out", str(tmp_path / "second.json")]) == 0
    second_out = capsys.readouterr().out
    assert "calibrating" not in second_out and "using the tree calibration" in second_out
    second = json.loads((tmp_path / "second.json").read_text())
    assert second["auto"]["predicted"] == predicted


def test_generate_says_which_tree_auto_chose(quick_model, capsys, monkeypatch):
    out, _ = quick_model
    monkeypatch.setattr(tree_calibration, "CALIBRATION_SIZES", (1, 2, 4))  # the choice said, not its quality
    argv = ["--model", str(out), "--prompt", "def main(", "--max-new-tokens", "8", "--tree", "auto"]
    assert run(generate.main, argv) == 0
    err = capsys.readouterr().err
    # a calibration this machine's load made implausible predicts nothing, and says so (issue 56, item 8)
    assert ("--tree auto: " in err and ("decoding plainly" in err or "predicted" in err)) or (
        "no speedup predicted: the calibration measured now is implausible" in err
    )
