"""One reader of config.json for the cost model and the decoder, and parameter counts that
match a real checkpoint (tied embeddings counted once)."""

import dataclasses
import json

import pytest
from safetensors.torch import load_file

from decoder.checkpoint import load_checkpoint
from decoder.model import LlamaConfig
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import BUNDLED_MODEL, load_model, model_shapes
from perfmodel.models.hf_config import parse_hf_config, read_hf_config
from perfmodel.planning.capacity import plan
from perfmodel.planning.memory import head_params, weight_params

TINY = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
}


def numel(file):
    return sum(t.numel() for t in load_file(str(file)).values())


def test_bundled_parameter_counts_match_its_checkpoint_files():
    model = load_model("bundled")
    assert model.tie_word_embeddings
    assert weight_params(model) == numel(BUNDLED_MODEL / "model.safetensors")
    assert head_params(model) == numel(BUNDLED_MODEL / "medusa_lm_head.safetensors")


def test_a_tied_lm_head_is_counted_once_and_an_untied_one_unchanged():
    llama = load_model("llama-7b")
    assert not llama.tie_word_embeddings
    assert weight_params(llama) == 6_738_415_616
    tied = dataclasses.replace(llama, tie_word_embeddings=True)
    assert weight_params(llama) - weight_params(tied) == 4096 * 32000
    assert head_params(tied) == head_params(llama)


def test_bundled_plan_weighs_the_tied_model_once():
    row = plan("bundled", "a100").devices.iloc[0]
    files = {name: numel(BUNDLED_MODEL / name) for name in ("model.safetensors", "medusa_lm_head.safetensors")}
    assert row["weights_gb"] == pytest.approx(files["model.safetensors"] * 2 / 1e9)
    assert row["heads_gb"] == pytest.approx(files["medusa_lm_head.safetensors"] * 2 / 1e9)


def test_decoder_and_cost_model_read_the_same_shapes():
    parsed = read_hf_config(BUNDLED_MODEL)
    model, decoder = model_shapes(parsed, "bundled"), load_checkpoint("bundled").config
    assert decoder == LlamaConfig.from_hf(parsed)
    assert (
        decoder.hidden_size,
        decoder.intermediate_size,
        decoder.num_attention_heads,
        decoder.num_key_value_heads,
    ) == (
        model.hidden_size,
        model.intermediate_size,
        model.num_heads,
        model.num_kv_heads,
    )
    assert (
        decoder.num_hidden_layers,
        decoder.vocab_size,
        decoder.head_dim,
        decoder.medusa_num_heads,
        decoder.tie_word_embeddings,
    ) == (
        model.num_layers,
        model.vocab_size,
        model.head_dim,
        model.medusa_heads,
        model.tie_word_embeddings,
    )


def test_decoder_config_round_trips_through_the_shared_reader():
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        eos_token_id=7,
        medusa_num_heads=3,
        medusa_num_layers=2,
    )
    assert LlamaConfig.from_hf(json.loads(json.dumps(config.to_hf()))) == config


def test_defaults_and_variants_of_config_json():
    plain = parse_hf_config(TINY)
    assert (
        plain.tie_word_embeddings,
        plain.head_dim,
        plain.rope_theta,
        plain.rms_norm_eps,
        plain.medusa.num_heads,
    ) == (False, 64, 10000.0, 1e-6, None)
    assert parse_hf_config({**TINY, "num_key_value_heads": None}).num_key_value_heads == 32
    # transformers >= 5 nests rope_theta; several end tokens keep the first.
    nested = parse_hf_config(
        {**TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "eos_token_id": [128001, 128009]}
    )
    assert (nested.rope_theta, nested.eos_token_id) == (5e5, 128001)
    assert LlamaConfig.from_hf(nested).rope_theta == 5e5


def test_rope_scaling_is_refused_by_the_decoder_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    assert load_model(tmp_path).hidden_size == 2048
    with pytest.raises(PerfkitError, match="RoPE scaling 'llama3'"):
        LlamaConfig.from_hf(read_hf_config(tmp_path))


def test_bad_config_json_is_named(tmp_path):
    file = tmp_path / "config.json"
    with pytest.raises(PerfkitError, match="missing key 'vocab_size'"):
        parse_hf_config({k: v for k, v in TINY.items() if k != "vocab_size"}, file)
    file.write_text(json.dumps({**TINY, "tie_word_embeddings": "yes"}))
    with pytest.raises(PerfkitError, match="tie_word_embeddings must be true or false"):
        load_model(file)
