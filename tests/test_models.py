import json

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import ModelConfig, from_hf_config, load_model

# The models' published config.json shapes: (h, i, n, n_kv, layers, vocab).
PUBLISHED_SHAPES = {
    "llama-7b": (4096, 11008, 32, 32, 32, 32000),
    "llama-13b": (5120, 13824, 40, 40, 40, 32000),
    "llama-33b": (6656, 17920, 52, 52, 60, 32000),
    "llama-2-70b": (8192, 28672, 64, 8, 80, 32000),
    "llama-3-8b": (4096, 14336, 32, 8, 32, 128256),
    "mistral-7b": (4096, 14336, 32, 8, 32, 32000),
}


@pytest.mark.parametrize("name", PUBLISHED_SHAPES)
def test_presets_have_the_design_shapes(name):
    m = load_model(name)
    assert (
        m.hidden_size,
        m.intermediate_size,
        m.num_heads,
        m.num_kv_heads,
        m.num_layers,
        m.vocab_size,
    ) == PUBLISHED_SHAPES[name]
    assert m.head_dim == 128


@pytest.mark.parametrize(
    "alias, preset", [("vicuna-7b", "llama-7b"), ("Vicuna_13B", "llama-13b"), ("vicuna-33b", "llama-33b")]
)
def test_vicuna_names_are_aliases(alias, preset):
    assert load_model(alias) == load_model(preset)


def write_config(tmp_path, **overrides):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 22,
        "vocab_size": 32000,
    }
    cfg.update(overrides)
    folder = tmp_path / "tinyllama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return folder


def test_hf_config_from_folder_or_file(tmp_path):
    folder = write_config(tmp_path)
    m = load_model(folder)
    assert m.name == "tinyllama"
    assert (m.hidden_size, m.num_kv_heads, m.head_dim, m.group_size) == (2048, 4, 64, 8)
    assert from_hf_config(folder / "config.json") == m


def test_hf_config_without_gqa_and_with_medusa_heads(tmp_path):
    m = load_model(write_config(tmp_path, num_key_value_heads=None, medusa_num_heads=5, head_dim=128))
    assert m.num_kv_heads == 32 and m.medusa_heads == 5 and m.head_dim == 128


def test_hf_config_missing_key_is_named(tmp_path):
    folder = write_config(tmp_path, intermediate_size=None)
    with pytest.raises(PerfkitError, match="missing key 'intermediate_size'"):
        load_model(folder)


def test_hf_config_that_is_not_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(PerfkitError, match="not valid JSON"):
        from_hf_config(bad)


def test_unknown_model_suggests_the_closest():
    with pytest.raises(PerfkitError, match="unknown model 'llama-7c'.*closest match: llama-7b"):
        load_model("llama-7c")


def test_inconsistent_shapes_are_refused():
    with pytest.raises(PerfkitError, match="multiple of num_kv_heads"):
        ModelConfig("odd", 4096, 11008, 32, 5, 32, 32000, 128)
    with pytest.raises(PerfkitError, match="hidden_size must be an integer from 1 to"):
        ModelConfig("neg", -1, 11008, 32, 32, 32, 32000, 128)
