"""Issue 59: n-gram (prompt-lookup) drafting priced by a measured host cost. The proposer
(decoder.ngram) finds what vLLM's NgramProposer finds; its timing command
(profilers.ngram_lookup) writes the columns perfmodel.measured.ngram_host reads back; the
reader interpolates and scales with the batch; bad settings are one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from decoder.ngram import NgramSettings, propose, propose_batch
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.hardware.cpu_identity import this_cpu_key
from perfmodel.measured import ngram_host
from perfmodel.measured.ngram_host import COLUMNS, NgramHostCost, ngram_host_cost
from perfmodel.measured.store import HOME_VARIABLE, user_measurements_dir
from profilers import ngram_lookup


def proposed(tokens, min_n, max_n, k, **kwargs) -> list[int]:
    return propose(np.asarray(tokens, dtype=np.int32), min_n, max_n, k, **kwargs).tolist()


# -- the proposer -----------------------------------------------------------------------------


def test_the_longest_ngram_ending_the_history_proposes_what_followed_it():
    # vLLM's docstring example: [4, 2, 3] has no earlier match, [2, 3] has; 3 tokens follow it
    assert proposed([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]
    # [2, 3] first occurs followed by 7, [1, 2, 3] followed by 8: the longest n-gram wins
    history = [0, 2, 3, 7, 1, 2, 3, 8, 1, 2, 3]
    assert proposed(history, 1, 3, 1) == [8]
    assert proposed(history, 1, 2, 1) == [7]  # max_n 2 looks no further than [2, 3]
    assert proposed(history, 3, 3, 2) == [8, 1]


def test_the_earliest_occurrence_of_the_longest_ngram_is_taken():
    assert proposed([1, 2, 5, 1, 2, 6, 1, 2], 2, 2, 1) == [5]
    # a run of one token overlaps itself: 3-gram [5, 5, 5] at 0, one token after it
    assert proposed([5, 5, 5, 5], 1, 3, 2) == [5]


def test_no_match_proposes_nothing():
    for history, min_n in (([1, 2, 3, 4], 1), ([1, 2, 9, 1, 2], 3), ([7], 1), ([], 1)):
        out = propose(np.asarray(history, dtype=np.int32), min_n, 5, 3)
        assert out.size == 0 and out.dtype.kind in "iu", history


def test_k_caps_the_proposal_and_so_does_the_end_of_the_history():
    assert proposed([1, 2, 3, 1, 2], 2, 2, 2) == [3, 1]
    assert proposed([1, 2, 3, 1, 2], 2, 2, 5) == [3, 1, 2]  # only three tokens follow the match
    assert proposed([1, 2, 1, 2], 1, 2, 3, max_model_len=5) == [1]  # one token left before max_model_len
    assert proposed([1, 2, 1, 2], 1, 2, 3, max_model_len=4) == []


def vllm_loop(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's _find_longest_matched_ngram_and_propose_tokens, transliterated: KMP's failure
    function over the reversed history, capped at max_n."""
    total = len(tokens)
    if total < min_n:
        return []
    backwards = tokens[::-1]
    failure = [0] * max_n
    longest = position = matched = 0
    i = 1
    while i < total:
        if backwards[matched] == backwards[i]:
            matched += 1
            if matched >= longest:
                longest, position = matched, i
            if i < max_n:
                failure[i] = matched
            if matched == max_n:
                matched = failure[max_n - 1]
            i += 1
        elif matched:
            matched = failure[matched - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + k]


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The rule said plainly: from max_n down, the first n whose last n tokens occur earlier
    (ending before the last token), at their earliest occurrence."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        for start in range(total - n):
            if tokens[start : start + n] == tokens[total - n :]:
                return tokens[start + n : start + n + k]
    return []


def test_the_proposer_matches_vllms_loop_and_the_plain_rule_on_random_histories():
    rng = np.random.default_rng(59)
    for _ in range(1500):
        history = rng.integers(0, int(rng.integers(1, 5)), int(rng.integers(0, 40))).astype(np.int32)
        min_n = int(rng.integers(1, 5))
        max_n, k = min_n + int(rng.integers(0, 4)), int(rng.integers(1, 6))
        tokens = history.tolist()
        got = propose(history, min_n, max_n, k).tolist()
        assert got == vllm_loop(tokens, min_n, max_n, k) == brute_force(tokens, min_n, max_n, k), (
            tokens,
            min_n,
            max_n,
            k,
        )


def test_the_batch_is_each_history_proposed_for():
    rng = np.random.default_rng(1)
    histories = [rng.integers(0, 3, n).astype(np.int64) for n in (0, 1, 5, 30, 60)]
    settings = NgramSettings(2, 4, 3)
    batch = propose_batch(histories, settings)
    assert [b.tolist() for b in batch] == [propose(h, 2, 4, 3).tolist() for h in histories]


@pytest.mark.parametrize(
    "settings, said",
    [
        ((0, 5, 3), "min_n (prompt_lookup_min) must be an integer >= 1, got 0"),
        ((3, 2, 3), "max_n (prompt_lookup_max) must be an integer >= min_n (3), got 2"),
        ((2, 5, 0), "k (tokens proposed per step) must be an integer >= 1, got 0"),
        ((2.0, 5, 3), "min_n (prompt_lookup_min) must be an integer >= 1, got 2.0"),
        ((2, 5, True), "k (tokens proposed per step) must be an integer >= 1, got True"),
    ],
)
def test_bad_settings_are_one_line_errors(settings, said):
    with pytest.raises(PerfkitError) as error:
        NgramSettings(*settings)
    assert said in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(PerfkitError):
        propose(np.arange(4), *settings)


def test_a_history_that_is_not_token_ids_is_a_one_line_error():
    for history, said in ((np.zeros((2, 3), dtype=np.int32), "must be 1-D"), (np.ones(4) / 2, "integer token ids")):
        with pytest.raises(PerfkitError, match=said):
            propose(history, 1, 2, 1)


# -- the command and the reader ---------------------------------------------------------------


def test_the_quick_run_writes_the_declared_columns_and_the_reader_reads_them_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path / "home"))
    out = tmp_path / "lookup.csv"
    assert run(ngram_lookup.main, ["--quick", "--calls", "5", "--out", str(out), "--store"]) == 0
    table = pd.read_csv(out)
    assert tuple(table.columns) == COLUMNS
    assert sorted(zip(table.context, table.k)) == [
        (c, k) for c in ngram_lookup.QUICK_CONTEXTS for k in ngram_lookup.QUICK_KS
    ]
    assert (table.seconds_median > 0).all() and (table.seconds_p90 >= table.seconds_median).all()
    assert table.matched_share.between(0, 1).all() and (table.calls == 5).all()
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())
    assert meta[ngram_host.META_HOST] == this_cpu_key() and meta["numpy"] == np.__version__
    assert meta["text"]["tokenizer"] == "decoder/assets/bundled/tokenizer.json" and meta["quick"] is True
    printed = capsys.readouterr().out
    assert "median us/seq" in printed and f"csv: {out}" in printed

    stored = ngram_host_cost(roots=[user_measurements_dir()])
    assert stored.contexts == ngram_lookup.QUICK_CONTEXTS and stored.ks == ngram_lookup.QUICK_KS
    assert stored.seconds(1, 256, 1) == pytest.approx(table.seconds_median[0])
    assert f"{this_cpu_key()}/ngram-lookup/ngram-lookup.csv" in stored.label
    assert NgramHostCost.from_csv(out).per_sequence_s == stored.per_sequence_s


def test_the_command_refuses_bad_settings_in_one_line(tmp_path, capsys):
    assert run(ngram_lookup.main, ["--min-n", "3", "--max-n", "2", "--out", str(tmp_path / "x.csv")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_n (prompt_lookup_max) must be an integer >= min_n (3), got 2" in err
    assert not (tmp_path / "x.csv").exists()


def stored_grid(root, host="cpu-test-4c", rows=None) -> None:
    """A measurement of host under root: contexts 100 and 300, k 1 and 3."""
    rows = rows or [(100, 1, 1e-6), (100, 3, 3e-6), (300, 1, 2e-6), (300, 3, 6e-6)]
    table = pd.DataFrame(
        [
            {"context": c, "k": k, "min_n": 2, "max_n": 5, "seconds_median": s, "seconds_p90": s, "calls": 9}
            | {"matched_share": 0.5}
            for c, k, s in rows
        ],
        columns=list(COLUMNS),
    )
    meta = {
        ngram_host.META_HOST: host,
        ngram_host.META_CPU: "Test CPU",
        ngram_host.META_MEASURED: "2026-01-02T03:04:05Z",
    }
    ngram_lookup.write_measurement(table, meta, root / host / ngram_host.FOLDER / ngram_host.FILE_NAME)


def test_the_reader_interpolates_clamps_and_scales_with_the_batch(tmp_path):
    stored_grid(tmp_path)
    cost = ngram_host_cost(roots=[tmp_path], host="cpu-test-4c")
    assert cost.seconds(1, 200, 1) == pytest.approx(1.5e-6)
    assert cost.seconds(1, 200, 2) == pytest.approx(3e-6)  # halfway between 1.5 (k 1) and 4.5 us (k 3)
    assert cost.seconds(16, 200, 2) == pytest.approx(16 * 3e-6)
    assert cost.seconds(0, 200, 2) == 0
    assert cost.seconds(1, 50, 1) == pytest.approx(1e-6) and cost.seconds(1, 1000, 5) == pytest.approx(6e-6)
    assert cost.clamping(200, 2) == "" and cost.label_for(200, 2) == cost.label
    assert "context 1000 priced as 300 (the most measured)" in cost.label_for(1000, 2)
    assert cost.label.startswith(
        "measured on Test CPU (cpu-test-4c/ngram-lookup/ngram-lookup.csv, 2026-01-02): n-gram lookup (2- to 5-grams) "
        "x batch on the host; contexts 100-300 tokens and k 1-3 measured"
    )
    other = ngram_host_cost(roots=[tmp_path], host="cpu-else-8c")
    assert other.seconds(1, 200, 1) == cost.seconds(1, 200, 1)
    assert "standing in for cpu-else-8c: not measured there" in other.label
    for batch, context, k in ((-1, 200, 1), (1.5, 200, 1), (1, 0, 1), (1, float("nan"), 1), (1, 200, 0)):
        with pytest.raises(PerfkitError, match="must be"):
            cost.seconds(batch, context, k)


def test_the_reader_refuses_what_it_cannot_price_in_one_line(tmp_path):
    with pytest.raises(PerfkitError) as none:
        ngram_host_cost(roots=[tmp_path])
    assert "python -m profilers.ngram_lookup --store" in str(none.value) and "\n" not in str(none.value)
    stored_grid(tmp_path, rows=[(100, 1, 1e-6), (100, 3, 3e-6), (300, 1, 2e-6)])
    with pytest.raises(PerfkitError, match="no row for context 300 and k 3"):
        ngram_host_cost(roots=[tmp_path])
    path = tmp_path / "cpu-test-4c" / ngram_host.FOLDER / ngram_host.FILE_NAME
    path.write_text("context,k\n1,1\n")
    with pytest.raises(PerfkitError, match="no column min_n, max_n, seconds_median"):
        NgramHostCost.from_csv(path)
    path.write_text(",".join(COLUMNS) + "\n100,1,2,5,-1,1,9,0.5\n")
    with pytest.raises(PerfkitError, match="line 2 is not a measured point"):
        NgramHostCost.from_csv(path)
