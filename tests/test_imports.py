"""Importing Vidur's measured GPU profiles (profilers.imports), and the imported files shipped.

The fixture tests/data/vidur/compute/a100/Llama-2-7b-hf.mlp.csv is 12 rows copied verbatim
from Vidur's a100 Llama-2-7b-hf profile (provenance in tests/data/vidur/README.md): 1, 512
and 2048 tokens at tp 1, 2 and 8, the 2048-token point profiled twice at each.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.measured.contract import COLUMNS, KEY_COLUMNS, check_table, read_table
from perfmodel.measured.store import MEASUREMENTS_DIR, stored_devices, stored_sweeps
from perfmodel.measured.vidur import VIDUR_COMMIT
from profilers.import_vidur import SHARD_COLUMNS, import_vidur
from profilers.imports import build_parser, main

DATA = Path(__file__).resolve().parent / "data" / "vidur"
EXCERPT = DATA / "compute" / "a100" / "Llama-2-7b-hf.mlp.csv"
OPS = {"qkv", "o", "gate_up", "down", "act", "norm", "rope", "residual", "embed"}
SHIPPED = {
    "a100-sxm": ["vidur-Llama-2-7b-hf.csv", "vidur-Meta-Llama-3-8B.csv"],
    "h100-sxm": ["vidur-Llama-2-7b-hf.csv", "vidur-internlm-20b.csv"],
}


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return import_vidur(EXCERPT, "a100-sxm").rows


def one(rows: pd.DataFrame, **point) -> pd.Series:
    match = rows[(rows[list(point)] == pd.Series(point)).all(axis=1)]
    assert len(match) == 1, point
    return match.iloc[0]


def profile(tmp_path: Path, relative: str = "compute/a100/Llama-2-7b-hf.mlp.csv", change=None) -> Path:
    """The excerpt at another path, optionally edited (change: DataFrame -> DataFrame)."""
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if change is None:
        shutil.copy(EXCERPT, path)
    else:
        change(pd.read_csv(EXCERPT)).to_csv(path, index=False)
    return path


def error_of(path: Path, device: str = "a100-sxm", **options) -> str:
    with pytest.raises(PerfkitError) as info:
        import_vidur(path, device, **options)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_one_row_per_profile_row_and_op(rows):
    assert len(rows) == 12 * len(OPS)
    assert set(rows["op"]) == OPS
    check_table(rows)
    assert list(rows.columns[: len(COLUMNS)]) == COLUMNS
    assert set(SHARD_COLUMNS) <= set(rows.columns)
    assert set(rows["device"]) == {"a100-sxm"} and set(rows["dtype"]) == {"fp16"}
    assert set(rows["source"]) == {"measured"} and set(rows["phase"]) == {"prefill"}
    assert set(rows["batch"]) == {1} and set(rows["candidates"]) == {1}
    assert set(rows["seq_len"]) == {1, 512, 2048} and set(rows["tp"]) == {1, 2, 8}


def test_times_are_the_median_in_seconds_and_noise_is_std_over_median(rows):
    # Excerpt data row 6 (num_tokens 512, tp 2): mlp_up_proj median 0.2235 ms, std 0.001739971264130533 ms.
    row = one(rows, op="gate_up", tp=2, seq_len=512)
    assert row["time_s"] == pytest.approx(0.2235e-3, rel=1e-9)
    assert row["noise"] == pytest.approx(0.001739971264130533 / 0.2235, abs=1e-6)
    assert row["profile_row"] == 6
    # attn_pre_proj median 0.1285 ms, std 0.0005000000000000004 ms in the same row.
    qkv = one(rows, op="qkv", tp=2, seq_len=512)
    assert qkv["time_s"] == pytest.approx(0.1285e-3, rel=1e-9)
    assert qkv["noise"] == pytest.approx(0.0005 / 0.1285, abs=1e-6)
    assert qkv["tflops"] == pytest.approx(qkv["flops"] / qkv["time_s"] / 1e12, rel=1e-5)


def test_norm_comes_from_input_layernorm(rows):
    # Data row 6: input_layernorm median 0.011 ms; post_attention_layernorm (0.012 ms) is not imported.
    raw = pd.read_csv(EXCERPT).iloc[6]
    assert one(rows, op="norm", tp=2, seq_len=512)["time_s"] == pytest.approx(
        raw["time_stats.input_layernorm.median"] / 1e3
    )
    assert (rows["op"] == "norm").sum() == 12


def test_each_tp_degree_is_one_shard(rows):
    shapes = ["model", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"]
    by_tp = rows.drop_duplicates("tp").set_index("tp")[shapes]
    assert by_tp.loc[1].tolist() == ["Llama-2-7b-hf", 4096, 11008, 32, 32, 128, 32768]
    assert by_tp.loc[2].tolist() == ["Llama-2-7b-hf@tp2", 4096, 5504, 16, 16, 128, 32768]
    assert by_tp.loc[8].tolist() == ["Llama-2-7b-hf@tp8", 4096, 1376, 4, 4, 128, 32768]


def test_costs_are_the_shards_gemms(rows):
    gate_up = rows[rows["op"] == "gate_up"]
    assert (gate_up["flops"] == 2 * gate_up["seq_len"] * 4096 * 2 * gate_up["intermediate_size"]).all()
    qkv = rows[rows["op"] == "qkv"]
    width = (qkv["num_heads"] + 2 * qkv["num_kv_heads"]) * qkv["head_dim"]
    assert (qkv["flops"] == 2 * qkv["seq_len"] * 4096 * width).all()
    down = one(rows, op="down", tp=8, seq_len=1)
    assert down["bytes"] == 2 * (1 * 1376 + 1376 * 4096 + 1 * 4096)


def test_repeated_points_are_kept_apart(rows):
    again = rows[rows["repeat"] == 1]
    assert set(again["seq_len"]) == {2048} and len(again) == 3 * len(OPS)
    assert not rows[rows["repeat"] == 0].duplicated(KEY_COLUMNS).any()
    first, second = (one(rows, op="gate_up", tp=1, seq_len=2048, repeat=r) for r in (0, 1))
    assert (first["profile_row"], second["profile_row"]) == (0, 1)
    assert (first["time_s"], second["time_s"]) == (pytest.approx(1.694e-3), pytest.approx(1.693e-3))


def test_run_id_names_the_file_in_vidurs_repository_and_commit(rows, tmp_path):
    assert set(rows["run_id"]) == {"vidur@7d47513:compute/a100/Llama-2-7b-hf/mlp.csv"}
    assert VIDUR_COMMIT.startswith("7d47513")
    assert set(import_vidur(EXCERPT, "a100-sxm", commit="abcdef0123").rows["run_id"]) == {
        "vidur@abcdef0:compute/a100/Llama-2-7b-hf/mlp.csv"
    }
    assert set(import_vidur(EXCERPT, "a100-sxm", run_id="mine").rows["run_id"]) == {"mine"}
    upstream = import_vidur(profile(tmp_path, "data/profiling/compute/a100/Llama-2-7b-hf/mlp.csv"), "a100-sxm")
    assert set(upstream.rows["run_id"]) == {"vidur@7d47513:compute/a100/Llama-2-7b-hf/mlp.csv"}
    assert set(upstream.rows["model"]) == {"Llama-2-7b-hf", "Llama-2-7b-hf@tp2", "Llama-2-7b-hf@tp8"}


def test_a_device_alias_resolves_to_its_key():
    assert set(import_vidur(EXCERPT, "NVIDIA A100-SXM4-80GB").rows["device"]) == {"a100-sxm"}


def test_a_path_that_names_no_device_takes_the_given_one(tmp_path):
    imported = import_vidur(profile(tmp_path, "excerpt.mlp.csv"), "h100-sxm")
    assert set(imported.rows["device"]) == {"h100-sxm"}
    assert set(imported.rows["model"]) == {"excerpt", "excerpt@tp2", "excerpt@tp8"}
    assert "names no device: taken to be h100-sxm" in imported.summary()
    assert set(imported.rows["run_id"]) == {"vidur@7d47513:excerpt.mlp.csv"}


def test_a_profile_of_another_device_is_an_error(tmp_path):
    message = error_of(EXCERPT, "h100-sxm")
    assert "'a100'" in message and "a100-sxm" in message and "h100-sxm" in message
    message = error_of(profile(tmp_path, "compute/h100/Llama-2-7b-hf.mlp.csv"), "a100-sxm")
    assert "'h100'" in message and "h100-sxm" in message and "--gpu a100-sxm" in message
    # Vidur's a100 is the SXM part, not what the bare name `a100` resolves to.
    assert "a100-pcie" in error_of(EXCERPT, "a100")


def test_unknown_columns_are_errors(tmp_path):
    path = profile(tmp_path, change=lambda df: df.assign(**{"time_stats.attn_softmax.median": 0.1}))
    message = error_of(path)
    assert "'time_stats.attn_softmax.median'" in message and "attn_pre_proj" in message and "n_kv_head" in message
    path = profile(tmp_path, change=lambda df: df.assign(weird=1))
    assert "unknown column 'weird'" in error_of(path)
    path = profile(tmp_path, change=lambda df: df.drop(columns="n_kv_head"))
    assert "missing shape column(s) n_kv_head" in error_of(path)
    path = profile(tmp_path, change=lambda df: df.drop(columns="time_stats.emb.std"))
    assert "time_stats.emb.std" in error_of(path)


def test_missing_and_empty_files_are_errors(tmp_path):
    missing = tmp_path / "compute" / "a100" / "nonesuch.mlp.csv"
    assert str(missing) in error_of(missing) and "does not exist" in error_of(missing)
    empty = profile(tmp_path, "compute/a100/empty.mlp.csv")
    empty.write_text("")
    assert f"profile {empty} is empty" in error_of(empty)
    empty.write_text(EXCERPT.read_text().splitlines()[0] + "\n")
    assert f"profile {empty} is empty" in error_of(empty)


def test_bad_values_are_errors(tmp_path):
    assert "unknown device 'nonesuch'" in error_of(EXCERPT, "nonesuch")
    assert "'xyz'" in error_of(EXCERPT, commit="xyz")
    path = profile(tmp_path, change=lambda df: df.assign(**{"time_stats.add.median": 0.0}))
    assert "time_stats.add.median is 0.0" in error_of(path)


def test_a_shard_that_differs_from_vidurs_is_an_error(tmp_path):
    # 4 KV heads over 8 devices: shard() keeps one per device, Vidur would split them (and cannot).
    path = profile(tmp_path, change=lambda df: df.assign(n_kv_head=4))
    message = error_of(path)
    assert "tp=8" in message and "QKV width is 768, Vidur's 640" in message


def test_an_ungated_mlp_imports_up_and_no_activation(tmp_path):
    rows = import_vidur(profile(tmp_path, change=lambda df: df.assign(use_gated_mlp=False)), "a100-sxm").rows
    assert set(rows["op"]) == OPS - {"gate_up", "act"} | {"up"}
    up = rows[rows["op"] == "up"]
    assert (up["flops"] == 2 * up["seq_len"] * 4096 * up["intermediate_size"]).all()


def test_the_command_line_writes_the_rows_and_a_summary(tmp_path, capsys):
    out = tmp_path / "imported.csv"
    assert run(main, ["vidur", str(EXCERPT), "--gpu", "a100-sxm", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{EXCERPT}: {12 * len(OPS)} rows from 12 profile rows (3 repeated points)")
    assert "tokens 1-2048, tp 1,2,8" in lines[0] and lines[1] == f"{out}: {12 * len(OPS)} rows"
    written = read_table(out)
    assert len(written) == 12 * len(OPS) and set(SHARD_COLUMNS) <= set(written.columns)


def test_command_line_errors_are_one_line(tmp_path, capsys):
    args = ["--gpu", "a100-sxm", "--out", str(tmp_path / "out.csv")]
    assert run(main, ["vidur", str(tmp_path / "nonesuch.mlp.csv"), *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: profile ") and "nonesuch.mlp.csv" in err
    assert run(main, ["vidur", str(EXCERPT), "--gpu", "a100-sxm", "--out", str(tmp_path / "out.txt")]) == 1
    assert "use a .csv or .parquet" in capsys.readouterr().err
    assert not (tmp_path / "out.csv").exists()


def test_every_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["vidur"]
    silent = [a.dest for a in sub._actions if a.option_strings and not (a.help or "").strip()]
    assert not silent


# The shipped imports.


def shipped_path(device: str, name: str) -> Path:
    return MEASUREMENTS_DIR / device / "imported" / name


@pytest.mark.parametrize("device, name", [(d, n) for d, names in SHIPPED.items() for n in names])
def test_the_shipped_imports_are_measured_rows_of_their_device(device, name):
    rows = read_table(shipped_path(device, name))
    model = name.removeprefix("vidur-").removesuffix(".csv")
    assert set(rows["source"]) == {"measured"} and set(rows["device"]) == {device}
    assert set(rows["op"]) == OPS and rows["time_s"].gt(0).all() and rows["noise"].ge(0).all()
    assert set(rows["model"]) == {model, *(f"{model}@tp{t}" for t in (2, 4, 8))}
    vidur_device = device.removesuffix("-sxm")
    assert set(rows["run_id"]) == {f"vidur@7d47513:compute/{vidur_device}/{model}/mlp.csv"}
    assert not rows[rows["repeat"] == 0].duplicated(KEY_COLUMNS).any()


def test_the_shipped_imports_cover_both_devices_with_their_licence_and_provenance():
    assert {d for d in SHIPPED} == {p.parent.parent.name for p in MEASUREMENTS_DIR.glob("*/imported/vidur-*.csv")}
    assert "MIT License" in (MEASUREMENTS_DIR / "vidur-LICENSE").read_text()
    provenance = (MEASUREMENTS_DIR / "IMPORTED.md").read_text()
    assert VIDUR_COMMIT in provenance
    for device, names in SHIPPED.items():
        for name in names:
            assert f"{device}/imported/{name}" in provenance


def test_the_shipped_rows_are_what_the_importer_makes_of_them(rows):
    # The excerpt's rows are verbatim rows of the shipped a100 Llama-2-7b-hf profile.
    shipped = read_table(shipped_path("a100-sxm", "vidur-Llama-2-7b-hf.csv"))
    point = ["tp", "op", "seq_len", "repeat"]
    merged = rows.merge(shipped, on=point, suffixes=("", "_shipped"))
    assert len(merged) == len(rows)
    for column in [c for c in rows.columns if c not in point and c not in ("profile_row", "run_id")]:
        assert (merged[column] == merged[f"{column}_shipped"]).all(), column


def test_stored_sweeps_do_not_see_the_imports():
    # imported/ is a subfolder: no sweep of its device, and no device of its own.
    devices = stored_devices([MEASUREMENTS_DIR])
    for device in SHIPPED:
        assert not [p for p in stored_sweeps(device, [MEASUREMENTS_DIR]) if "imported" in p.parts]
        assert (device in devices) == any((MEASUREMENTS_DIR / device).glob("*.csv"))
    assert "imported" not in devices
