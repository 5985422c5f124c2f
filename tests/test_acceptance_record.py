"""The typed acceptance record (perfmodel.acceptance.record): its one loader, and the one rule
for a checkpoint folder's own record, which the reports and the decoder's --tree auto share."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from decoder.auto_tree import checkpoint_accuracy
from perfmodel.acceptance.record import AcceptanceRecord, own_record, own_record_path
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import BUNDLED_MODEL
from reports.sources import report_acceptance

RECORD = BUNDLED_MODEL / "acceptance-greedy.json"
MINIMAL = {
    "head_topk_accuracy": [[0.5, 0.2], [0.4, 0.1]],
    "per_tree_size": [{"tree_size": n, "mean_accepted_tokens": m} for n, m in ((1, 1.0), (4, 1.6), (16, 1.9))],
}


def write(folder: Path, name: str, record) -> Path:
    path = folder / name
    path.write_text(json.dumps(record))
    return path


def test_the_bundled_record_loads_typed_and_writes_back_unchanged():
    record = AcceptanceRecord.load(RECORD)
    data = json.loads(RECORD.read_text())
    assert record.to_dict() == data and record.path == RECORD
    assert record.tree_sizes == [r["tree_size"] for r in data["per_tree_size"]]
    assert record.tokens_per_step == [r["mean_accepted_tokens"] for r in data["per_tree_size"]]
    assert record.accuracy.shape == np.asarray(data["head_topk_accuracy"]).shape
    assert (record.scheme, record.tree_size, record.batch) == (
        data["acceptance"]["scheme"],
        data["tree"]["size"],
        data["batch"],
    )
    assert record.mean_accepted_tokens == data["mean_accepted_tokens"] and record.lossless is data["lossless"]


def test_a_minimal_record_leaves_the_settings_unknown(tmp_path):
    record = AcceptanceRecord.load(write(tmp_path, "acc.json", MINIMAL))
    assert record.tree_sizes == [1, 4, 16] and record.scheme is None and record.batch is None
    assert record.accepted_length_histogram == {}


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("[1, 2]", "expected a JSON object written by python -m decoder.measure"),
        ("{not json", "not valid JSON"),
        (json.dumps({"head_topk_accuracy": [[0.5]]}), "missing 'per_tree_size'"),
        (json.dumps({**MINIMAL, "per_tree_size": []}), "per_tree_size must be a non-empty list"),
        (json.dumps({**MINIMAL, "per_tree_size": [{"tree_size": 4}]}), "per_tree_size[0] needs tree_size and"),
        (json.dumps({**MINIMAL, "per_tree_size": [{"tree_size": 0, "mean_accepted_tokens": 1.0}]}), "tree_size 0"),
        (json.dumps({**MINIMAL, "head_topk_accuracy": [[0.5, 1.5]]}), "probabilities in [0, 1]"),
        (json.dumps({**MINIMAL, "head_topk_accuracy": [[0.5, 0.1], [0.4]]}), "(heads, top-k)"),
        (json.dumps({**MINIMAL, "tree": {"size": "16"}}), "size must be an integer, got '16'"),
        (json.dumps({**MINIMAL, "acceptance": "greedy"}), "acceptance must be a JSON object"),
    ],
)
def test_a_bad_record_is_a_one_line_error_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "acceptance-greedy.json"
    path.write_text(content)
    with pytest.raises(PerfkitError) as err:
        AcceptanceRecord.load(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and fragment in message, message


def test_the_own_record_is_the_greedy_one_else_the_first_by_name(tmp_path):
    assert own_record_path(tmp_path) is None and own_record(tmp_path) is None
    write(tmp_path, "acceptance-typical.json", MINIMAL)
    write(tmp_path, "acceptance-rejection.json", MINIMAL)
    assert own_record_path(tmp_path) == tmp_path / "acceptance-rejection.json"
    greedy = write(tmp_path, "acceptance-greedy.json", MINIMAL)
    assert own_record_path(tmp_path) == greedy and own_record(tmp_path).path == greedy
    assert own_record_path("bundled") == RECORD  # a model name that resolves to a folder
    assert own_record_path("llama-7b") is None  # a preset has no folder, so no record


def test_reports_and_tree_auto_take_the_same_own_record(tmp_path):
    shutil.copy(BUNDLED_MODEL / "config.json", tmp_path / "config.json")
    accuracy = [[0.7, 0.2], [0.5, 0.1]]
    typical = write(tmp_path, "acceptance-typical.json", {**MINIMAL, "head_topk_accuracy": accuracy})
    report = report_acceptance(None, str(tmp_path))
    assert report.record_path == typical and report.record.path == typical
    # a checkpoint whose only record is of typical acceptance: --tree auto reads its accuracies too
    ckpt = SimpleNamespace(folder=tmp_path, info={"heldout_head_accuracy": [[0.1, 0.0]]})
    assert checkpoint_accuracy(ckpt).tolist() == accuracy
    typical.unlink()
    assert checkpoint_accuracy(ckpt).tolist() == [[0.1, 0.0]]  # the training card's, without a record
    write(tmp_path, "acceptance-greedy.json", {**MINIMAL, "head_topk_accuracy": [[2.0]]})
    with pytest.raises(PerfkitError, match="acceptance-greedy.json: not a usable decoder.measure record"):
        checkpoint_accuracy(ckpt)
