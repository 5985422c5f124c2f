"""A project checkpoint in the layout the engine loads: a Hugging Face Llama folder in fp32
(bf16 is emulated on a CPU without AVX-512 BF16 and prefills about 4x slower), with a
tokenizer_config.json beside tokenizer.json so that transformers' fast tokenizer reads it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from decoder.checkpoint import load_checkpoint, load_eagle, replacing, save_checkpoint
from decoder.eagle import EAGLE_FILES, EagleLayout
from perfmodel.base.errors import PerfkitError

ENGINE_DTYPE = "float32"


def export_medusa_heads(model: str | Path, out: Path) -> Path:
    """Write `model`'s Medusa heads to `out` as vLLM's Medusa drafter loads them: the heads'
    weights as they are (vLLM maps the reference layout's keys itself) in fp32, and a config
    of model_type medusa with the heads' count and their residual layer's bias."""
    checkpoint = load_checkpoint(model, dtype=torch.float32)
    heads = checkpoint.heads
    if heads is None:
        raise PerfkitError(f"{checkpoint.folder} has no Medusa heads: --speculation medusa needs a model with heads")
    if heads.num_layers != 1:
        raise PerfkitError(f"vLLM's Medusa drafter takes heads of one residual layer, not {heads.num_layers}")
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": checkpoint.config.hidden_size,
        "vocab_size": checkpoint.config.vocab_size,
        "num_heads": len(heads),
        "num_hidden_layers": heads.num_layers,
        "medusa_fc_bias": True,
        "torch_dtype": ENGINE_DTYPE,
    }
    with replacing(Path(out)) as staging:
        state = {k: v.detach().float().contiguous() for k, v in heads.state_dict().items()}
        save_file(state, str(staging / "model.safetensors"))
        (staging / "config.json").write_text(json.dumps(config, indent=1))
    return Path(out)


def export_eagle_drafter(model: str | Path, out: Path) -> Path:
    """Write `model`'s EAGLE drafter in vLLM's layout (decoder.eagle.EagleLayout.VLLM) to `out`
    as vLLM's EAGLE-1 loads it: a one-layer Llama config of the model's own shapes (vLLM
    makes it EagleLlamaForCausalLM), fc and the layer as layers.0 in fp32; the embedding and
    the LM head are the target's, which vLLM shares with a drafter that has none."""
    checkpoint = load_checkpoint(model, dtype=torch.float32)
    drafter = load_eagle(checkpoint.folder, checkpoint.config, EagleLayout.VLLM, torch.float32)
    if drafter is None:
        raise PerfkitError(
            f"{checkpoint.folder} has no EAGLE drafter in vLLM's layout ({EAGLE_FILES[EagleLayout.VLLM]}): "
            f"python -m decoder.train --eagle --eagle-layout vllm --model {model} trains one"
        )
    state = {
        (f"layers.0.{name[len('layer.') :]}" if name.startswith("layer.") else name): tensor.detach()
        .float()
        .contiguous()
        for name, tensor in drafter.state_dict().items()
    }
    config = {**checkpoint.config.to_hf(), "num_hidden_layers": 1, "torch_dtype": ENGINE_DTYPE}
    with replacing(Path(out)) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=1))
        save_file(state, str(staging / "model.safetensors"))
    return Path(out)


def export_for_engine(model: str | Path, out: Path) -> Path:
    """Write `model` (bundled, medusa2 or a folder) to `out` for the engine; returns `out`.
    The base model only: speculation's drafters are exported apart."""
    checkpoint = load_checkpoint(model, dtype=torch.float32)
    if checkpoint.tokenizer is None:
        raise PerfkitError(f"{checkpoint.folder} has no tokenizer.json: the engine needs one to serve text")
    with replacing(Path(out)) as staging:
        save_checkpoint(staging, checkpoint.model, None, checkpoint.tokenizer, dtype=torch.float32)
        config = json.loads((staging / "config.json").read_text())
        config["torch_dtype"] = ENGINE_DTYPE
        (staging / "config.json").write_text(json.dumps(config, indent=1))
        eos = config.get("eos_token_id")
        eos_text = checkpoint.tokenizer.id_to_token(eos) if isinstance(eos, int) else None
        tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_text}
        (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    return Path(out)
