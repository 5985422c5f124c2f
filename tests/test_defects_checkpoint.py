"""Issue 22, the reference decoder's checkpoints and training: a config that disagrees with
its weights, a corrupted weight file, undecodable or damaged files, head sizes that do not
divide, and `decoder.train --install` replacing the shipped model."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat

import pytest

from decoder import generate, train, training
from decoder.checkpoint import load_checkpoint
from decoder.model import LlamaConfig
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.models.config import BUNDLED_MODEL, MEDUSA2_MODEL, load_model
from perfmodel.models.hf_config import parse_hf_config
from tests.conftest import quick_copy

MANIFEST = "checksums.sha256"
CHECKPOINT_FILES = {
    "config.json",
    "model.safetensors",
    "medusa_lm_head.safetensors",
    "tokenizer.json",
    "medusa_tree.json",
    "training.json",
    MANIFEST,
}


@pytest.fixture
def bundled_copy(tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(BUNDLED_MODEL, folder)
    return folder


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# Item 11: a checkpoint whose config disagrees with its weights.


def test_a_config_with_fewer_layers_than_the_weights_is_refused(bundled_copy, capsys):
    edit_config(bundled_copy, num_hidden_layers=2)
    with pytest.raises(PerfkitError, match=r"model\.safetensors: holds tensors that .*config\.json does not use"):
        load_checkpoint(bundled_copy)
    assert run(generate.main, ["--model", str(bundled_copy), "--prompt", "def f(", "--max-new-tokens", "4"]) == 1
    assert "model.layers.2" in one_line_error(capsys)


def test_a_config_with_more_layers_than_the_weights_is_refused(bundled_copy):
    edit_config(bundled_copy, num_hidden_layers=6)
    with pytest.raises(PerfkitError, match=r"model\.safetensors: lacks tensors that .*config\.json implies"):
        load_checkpoint(bundled_copy)


def test_a_config_whose_shapes_differ_from_the_weights_is_refused(bundled_copy):
    edit_config(bundled_copy, intermediate_size=512)
    shapes = r"model\.safetensors: .*mlp.* has shape \(640, 256\) .* implies \(512, 256\)"
    with pytest.raises(PerfkitError, match=shapes):
        load_checkpoint(bundled_copy)


def corrupt(file, offset_from_end=100_000):
    data = bytearray(file.read_bytes())
    position = len(data) - offset_from_end
    data[position : position + 64] = bytes(255 - b for b in data[position : position + 64])
    file.write_bytes(bytes(data))


def test_a_corrupted_payload_fails_its_checksum(bundled_copy, capsys):
    corrupt(bundled_copy / "model.safetensors")
    with pytest.raises(PerfkitError) as exc:
        load_checkpoint(bundled_copy)
    message = str(exc.value)
    assert f"{bundled_copy / 'model.safetensors'}: SHA-256 differs" in message and "--rehash" in message
    corrupt(bundled_copy / "model.safetensors")  # undone: the bytes are the shipped ones again
    load_checkpoint(bundled_copy)


def test_the_heads_file_is_checked_too(bundled_copy):
    corrupt(bundled_copy / "medusa_lm_head.safetensors")
    with pytest.raises(PerfkitError, match=r"medusa_lm_head\.safetensors: SHA-256 differs"):
        load_checkpoint(bundled_copy)


def test_weights_changed_on_purpose_are_recorded_with_rehash(bundled_copy, capsys):
    corrupt(bundled_copy / "model.safetensors")
    from decoder import checkpoint

    assert run(checkpoint.main, [str(bundled_copy)]) == 1
    assert "SHA-256 differs" in one_line_error(capsys)
    assert run(checkpoint.main, ["--rehash", str(bundled_copy)]) == 0
    assert "checksums verified" in capsys.readouterr().out
    load_checkpoint(bundled_copy)


def test_a_checkpoint_without_a_manifest_loads_unchecked(bundled_copy):
    (bundled_copy / MANIFEST).unlink(missing_ok=True)
    assert load_checkpoint(bundled_copy).config.num_hidden_layers == 4


def test_a_weight_file_added_beside_the_listed_ones_is_refused(bundled_copy):
    shutil.copy(bundled_copy / "model.safetensors", bundled_copy / "model-copy.safetensors")
    with pytest.raises(PerfkitError, match=r"model\.safetensors: holds model\..*, already in .*model-copy"):
        load_checkpoint(bundled_copy)


@pytest.mark.parametrize(
    "folder, drafters",
    [(BUNDLED_MODEL, {"eagle_drafter.safetensors", "eagle_drafter_vllm.safetensors"}), (MEDUSA2_MODEL, set())],
    ids=["bundled", "medusa2"],
)
def test_the_shipped_checkpoints_carry_verified_checksums(folder, drafters):
    listed = {line.split("  ")[1] for line in (folder / MANIFEST).read_text().splitlines()}
    assert listed == {"model.safetensors", "medusa_lm_head.safetensors", *drafters}
    load_checkpoint(folder)  # verifies them


# Item 17: bad data gets a one-line error naming the file.


def test_a_damaged_safetensors_header_names_the_file(bundled_copy, capsys):
    (bundled_copy / MANIFEST).unlink(missing_ok=True)  # the checksum would catch it first
    file = bundled_copy / "model.safetensors"
    file.write_bytes(b"\xff" * 16 + file.read_bytes()[16:])
    with pytest.raises(PerfkitError, match=rf"{file}: not a readable weight file"):
        load_checkpoint(bundled_copy)
    assert run(generate.main, ["--model", str(bundled_copy), "--prompt", "x"]) == 1
    assert str(file) in one_line_error(capsys)


def test_a_truncated_heads_file_names_the_file(bundled_copy):
    (bundled_copy / MANIFEST).unlink(missing_ok=True)
    file = bundled_copy / "medusa_lm_head.safetensors"
    file.write_bytes(file.read_bytes()[:1000])
    with pytest.raises(PerfkitError, match=rf"{file}: not a readable weight file"):
        load_checkpoint(bundled_copy)


@pytest.mark.parametrize("name", ["config.json", "training.json", "medusa_tree.json"])
def test_a_non_utf8_file_of_the_checkpoint_is_named(bundled_copy, name, capsys):
    (bundled_copy / name).write_bytes(b'{"x": "\xe9t\xe9"}')
    with pytest.raises(PerfkitError, match=rf"{bundled_copy / name}: .*not UTF-8"):
        load_checkpoint(bundled_copy)
    assert run(generate.main, ["--model", str(bundled_copy), "--prompt", "x"]) == 1
    assert name in one_line_error(capsys)


def test_a_damaged_tokenizer_names_the_file(bundled_copy):
    (bundled_copy / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(PerfkitError, match=r"tokenizer\.json: not a readable tokenizer"):
        load_checkpoint(bundled_copy)


# Item 13: a hidden size the head count does not divide.


def test_a_hidden_size_not_divisible_by_the_head_count_is_refused(tmp_path, bundled_copy):
    config = {
        "vocab_size": 32000,
        "hidden_size": 4100,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PerfkitError, match="hidden_size 4100 is not divisible by num_attention_heads 32"):
        load_model(tmp_path / "config.json")
    with pytest.raises(PerfkitError, match="4100 .* 32"):
        parse_hf_config(config)
    with pytest.raises(PerfkitError, match="hidden_size 4100 is not divisible by num_attention_heads 32"):
        LlamaConfig(32000, 4100, 11008, 2, 32, 32)
    edit_config(bundled_copy, hidden_size=260, head_dim=None)  # 260 / 8 heads, the head size left implied
    with pytest.raises(PerfkitError, match="hidden_size 260 is not divisible by num_attention_heads 8"):
        load_checkpoint(bundled_copy)


def test_an_explicit_head_dim_may_differ_from_hidden_over_heads():
    # Mistral-NeMo style: 32 heads of 128 over a hidden size of 5120.
    config = {"vocab_size": 10, "hidden_size": 5120, "intermediate_size": 64, "num_hidden_layers": 1}
    parsed = parse_hf_config({**config, "num_attention_heads": 32, "head_dim": 128})
    assert parsed.head_dim == 128 and LlamaConfig.from_hf(parsed).head_dim == 128


# Item 14: `decoder.train --install` over the shipped model.


@pytest.fixture(scope="module")
def quick(quick_trained, tmp_path_factory):
    """A --quick checkpoint and its work folder (later runs resume from it: seconds); a copy
    of the one conftest trains once per run."""
    return quick_copy(quick_trained, tmp_path_factory)


@pytest.fixture
def installed(quick, tmp_path, monkeypatch):
    """A stand-in for the shipped model, with the acceptance record decoder.measure leaves
    there, at the place --install writes to."""
    target = tmp_path / "assets" / "bundled"
    shutil.copytree(BUNDLED_MODEL, target)
    monkeypatch.setattr(train, "BUNDLED", target)
    return target


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_install_without_force_and_without_a_terminal_is_refused(quick, installed, capsys):
    before = snapshot(installed)
    assert run(train.main, ["--quick", "--install", "--work", str(quick[1])]) == 1
    err = one_line_error(capsys)
    assert str(installed) in err and "--force" in err
    assert snapshot(installed) == before


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_install_asks_at_a_terminal(quick, installed, monkeypatch, capsys):
    before = snapshot(installed)
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    assert run(train.main, ["--quick", "--install", "--work", str(quick[1])]) == 1
    assert "replace it with the model trained? [y/N]" in capsys.readouterr().out
    assert snapshot(installed) == before
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    assert run(train.main, ["--quick", "--install", "--work", str(quick[1])]) == 0
    assert load_checkpoint(installed).config.hidden_size == train.QUICK.hidden_size


def test_install_with_force_replaces_the_folder_whole_with_normal_modes(quick, installed):
    umask = os.umask(0o022)
    try:
        assert run(train.main, ["--quick", "--install", "--force", "--work", str(quick[1])]) == 0
    finally:
        os.umask(umask)
    # Exactly the new checkpoint: the old model's acceptance record is gone with it.
    assert {p.name for p in installed.iterdir()} == CHECKPOINT_FILES
    assert load_checkpoint(installed).config.hidden_size == train.QUICK.hidden_size
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in installed.iterdir()} == dict.fromkeys(
        CHECKPOINT_FILES, 0o644
    )
    assert [p.name for p in installed.parent.iterdir()] == ["bundled"]  # no temporary folder left beside it


def test_a_failure_while_writing_leaves_the_old_model_in_place(quick, installed, monkeypatch):
    before = snapshot(installed)

    def dies_midway(folder, *args, **kwargs):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "save_checkpoint", dies_midway)
    assert run(train.main, ["--quick", "--install", "--force", "--work", str(quick[1])]) == 130
    assert snapshot(installed) == before
    assert [p.name for p in installed.parent.iterdir()] == ["bundled"]


def test_out_over_a_folder_that_is_no_checkpoint_is_refused_even_with_force(quick, tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("keep me")
    assert run(train.main, ["--quick", "--out", str(folder), "--force", "--work", str(quick[1])]) == 1
    assert "not a checkpoint folder" in one_line_error(capsys)
    assert (folder / "todo.txt").read_text() == "keep me"


def test_training_writes_files_others_can_read(quick):
    out, _ = quick
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == dict.fromkeys(
        CHECKPOINT_FILES, 0o666 & ~umask
    )
