"""An EAGLE drafter in vLLM's EAGLE-1 layout: trained by the project's own command, exported as
vLLM loads it, and drafting chains as vLLM's proposer does, over the target's greedy output."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from decoder.checkpoint import load_checkpoint, load_eagle
from decoder.eagle import EAGLE_FILES, EagleDrafter, EagleLayout
from decoder.eagle_chain import chain_path_lengths
from decoder.manifest import write_manifest
from decoder.medusa import Decoder
from decoder.train import main as train_main
from perfmodel.base.errors import PerfkitError
from profilers.engine.export import export_eagle_drafter
from profilers.engine.measure import Plan, speculative_config
from tests.distilled import CONFIG


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The bundled model with a vLLM-layout drafter from `decoder.train --eagle --eagle-layout
    vllm --quick` (a few seconds)."""
    out = tmp_path_factory.mktemp("eagle-vllm") / "ckpt"
    work = tmp_path_factory.mktemp("eagle-vllm-work")
    argv = ["--eagle", "--eagle-layout", "vllm", "--quick", "--out", str(out), "--work", str(work)]
    assert train_main(argv) == 0
    return load_checkpoint(out, dtype=torch.float32)


def test_the_vllm_layout_has_no_fc_bias_and_no_norms_around_its_layer():
    drafter = EagleDrafter(CONFIG, EagleLayout.VLLM)
    names = set(drafter.state_dict())
    assert "fc.bias" not in names and "norm.weight" not in names and "layer.input_layernorm.weight" not in names
    assert "layer.post_attention_layernorm.weight" in names and drafter.window is None
    assert {"fc.bias", "norm.weight", "layer.input_layernorm.weight"} <= set(EagleDrafter(CONFIG).state_dict())


def test_training_writes_the_vllm_drafter_beside_the_projects_own(trained):
    card = json.loads((trained.folder / "training.json").read_text())["eagle_vllm"]
    drafter = load_eagle(trained.folder, trained.config, EagleLayout.VLLM, torch.float32)
    assert card["layout"] == "vllm" and card["parameters"] == sum(p.numel() for p in drafter.parameters())
    assert card["window"] is None and 0 <= card["heldout_top1"] <= 1
    assert (trained.folder / EAGLE_FILES[EagleLayout.VLLM]).is_file()
    assert trained.eagle is not None  # the bundled model's own drafter is kept beside it


def test_it_is_exported_with_vllms_names_and_a_one_layer_config(trained, tmp_path):
    out = export_eagle_drafter(trained.folder, tmp_path / "drafter")
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == trained.config.hidden_size
    names = set(load_file(str(out / "model.safetensors")))
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"} <= names
    assert not any(n.startswith("layer.") or "input_layernorm" in n for n in names)
    spec = speculative_config(Plan(speculation="eagle"), out)
    assert spec == {"method": "eagle", "model": str(out), "num_speculative_tokens": 4}
    without = tmp_path / "without"
    shutil.copytree(trained.folder, without)
    (without / EAGLE_FILES[EagleLayout.VLLM]).unlink()
    write_manifest(without)
    with pytest.raises(PerfkitError, match="no EAGLE drafter in vLLM's layout .*--eagle-layout vllm"):
        export_eagle_drafter(without, tmp_path / "none")


def test_each_token_after_the_prefills_is_committed_by_one_chain_step(trained):
    decoder, drafter = Decoder(trained), load_eagle(trained.folder, trained.config, EagleLayout.VLLM, torch.float32)
    prompt = trained.tokenizer.encode("def parse_args(argv):\n").ids
    new = decoder.generate([prompt], 40).tokens[0]
    lengths = chain_path_lengths(drafter, trained.model, prompt + new, len(prompt), 4)
    # every token after the prefill's, the last step's own token perhaps one past the budget
    assert len(new) - 1 <= sum(lengths) <= len(new) and all(1 <= n <= 5 for n in lengths)
    with pytest.raises(PerfkitError, match="vLLM's layout"):
        chain_path_lengths(trained.eagle, trained.model, prompt + new, len(prompt), 4)
