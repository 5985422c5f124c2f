"""The project's decoder drafting as vLLM drafted, on the engine's own prompts: the shipped
Medusa measurement's acceptance per draft position, reproduced by the decoder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from decoder.train import main as train_main
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.engine_runs import (
    DECODER_REQUESTS_FILE,
    DECODER_SPECULATION_FILE,
    ENGINE_FOLDER,
    MEASUREMENTS_DIR,
    read_engine_measurement,
)
from profilers.engine.__main__ import main as engine_main
from profilers.engine.acceptance import chain_counts, write_decoder_speculation
from profilers.engine.measure import Plan
from profilers.engine.serve_config import serve_config

SHIPPED = MEASUREMENTS_DIR / "cpu-intel-xeon-processor-2c" / ENGINE_FOLDER / "bundled-seqs8-medusa"


def test_a_chain_counts_each_position_accepted_only_past_the_ones_before():
    # paths of 1 (nothing accepted), 3 (two) and 5 (all four) tokens, root included
    assert chain_counts([[1, 3], [5]], 4) == (3, [2, 2, 1, 1])


@pytest.mark.parametrize(
    "name, points", [("bundled-seqs8-medusa", 0.005), ("bundled-seqs8-eagle", 0.01), ("bundled-seqs8-draft", 0.015)]
)
def test_the_decoder_accepts_what_the_engine_accepted_on_the_same_prompts(name, points):
    measurement = read_engine_measurement(SHIPPED.parent / name)
    engine = measurement.speculation.drop_duplicates("repeat").set_index("repeat")
    for row in measurement.decoder_speculation.itertuples(index=False):
        ours = json.loads(row.accepted_per_position)
        theirs, drafts = json.loads(engine.loc[row.repeat, "accepted_per_position"]), engine.loc[row.repeat, "drafts"]
        assert abs(row.drafts / drafts - 1) < 0.02
        for a, b in zip(ours, theirs):
            assert a / row.drafts == pytest.approx(b / drafts, abs=points)  # per position, within `points`


# The first requests of repeat 0, in whole batches of the decoder's (DECODE_BATCH 16): request i's
# prompt is drawn from its index alone, so the first 64 of the shipped run's 300 are these.
REPLAYED = 64


def test_the_shipped_decoder_counts_are_reproduced(tmp_path):
    folder = tmp_path / "medusa"
    shutil.copytree(SHIPPED, folder)
    speculation = folder / "speculation.csv"
    lines = speculation.read_text().splitlines()
    speculation.write_text("\n".join([lines[0], *(line for line in lines[1:] if line.split(",")[1] == "0")]) + "\n")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["plan"]["requests"] == 300
    meta["plan"]["requests"] = REPLAYED
    (folder / "meta.json").write_text(json.dumps(meta))
    written = write_decoder_speculation(folder, log=lambda _: None)
    per_request = (folder / DECODER_REQUESTS_FILE).read_text().splitlines()
    shipped = (SHIPPED / DECODER_REQUESTS_FILE).read_text().splitlines()[: 1 + REPLAYED]
    assert per_request == shipped  # the header and each request's drafts and accepted tokens, exactly
    summed = written.read_text().splitlines()
    assert summed[0] == (SHIPPED / DECODER_SPECULATION_FILE).read_text().splitlines()[0]
    assert int(summed[1].split(",")[1]) == sum(int(line.split(",")[2]) for line in shipped[1:])  # its drafts


def test_only_the_drafters_the_decoder_twins_are_drafted_by_it(capsys):
    with pytest.raises(PerfkitError, match=r"only with Medusa heads, an EAGLE drafter or a draft model .* not off"):
        write_decoder_speculation(SHIPPED.parent / "bundled-seqs8")
    with pytest.raises(SystemExit):
        engine_main(["acceptance"])
    assert "--out" in capsys.readouterr().err


def test_a_shipped_folder_is_found_by_its_own_name():
    assert read_engine_measurement("bundled-seqs8-medusa").folder == SHIPPED


def test_a_speculative_config_of_another_drafter_is_refused_before_anything_starts(tmp_path):
    config = tmp_path / "ngram.json"
    config.write_text('{"method": "ngram", "num_speculative_tokens": 4}')
    with pytest.raises(PerfkitError, match=r"method 'ngram'; this command serves .*medusa, eagle"):
        serve_config(config, Plan(), Path("/nonexistent/python"), 10.0, tmp_path / "server.log")


def test_bad_speculation_options_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(PerfkitError, match=r"cannot read speculative config .*nope\.json"):
        serve_config(tmp_path / "nope.json", Plan(), Path("/nonexistent/python"), 10.0, tmp_path / "server.log")
    with pytest.raises(SystemExit):
        train_main(["--eagle", "--eagle-layout", "nope"])
    assert "invalid choice: 'nope' (choose from 'project', 'vllm')" in capsys.readouterr().err
