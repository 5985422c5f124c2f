"""The precision a checkpoint declares (perfmodel.base.precision): its linear weights' format
and its KV cache's, read from config.json's `quantization_config` or from NVIDIA ModelOpt's
`hf_quant_config.json` beside it. A scheme the cost model has no measured GEMMs for (AWQ,
GPTQ, bitsandbytes, MXFP4, INT8, fp8 blocks of another size) is refused in one line naming it:
priced as 16-bit weights it would be 1.3-1.6x off, silently.

The forms read (each as its producer writes it):
- `quant_method: fp8` (transformers' FineGrainedFP8 / vLLM's fp8 config): `weight_block_size`
  [128, 128] is fp8-block (Qwen3-32B-FP8, DeepSeek-V3), none is per-tensor fp8;
- `quant_method: modelopt` (or no quant_method beside a `quant_algo`) with `quant_algo` FP8 or
  NVFP4 and `kv_cache_quant_algo` (or `kv_cache_scheme`) FP8 or null: ModelOpt's checkpoints,
  and `hf_quant_config.json`'s `quantization` object of the same keys (NVIDIA's
  Llama-3.1-70B-Instruct-FP8);
- `quant_method: mxfp4` with `modules_to_not_convert` naming the attention (gpt-oss): the
  experts in MXFP4, the rest in 16 bits (`Precision.experts`);
- `quant_method: compressed-tensors` (LLM Compressor's FP8 checkpoints): every config group's
  weights 8-bit floats, per tensor or per output channel (both priced on the per-tensor fp8
  rows: the same W8A8 GEMM with a scale vector instead of a scalar), and `kv_cache_scheme` of
  8-bit floats an fp8 KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.base.precision import KvFormat, WeightFormat

# ModelOpt writes a quantized checkpoint's settings to this file beside config.json (NVIDIA's
# Llama-3.1-70B-Instruct-FP8 declares nothing in config.json itself).
MODELOPT_QUANT_FILE = "hf_quant_config.json"
MODELOPT_ALGOS = {"FP8": WeightFormat.FP8, "NVFP4": WeightFormat.NVFP4}
BLOCK = [128, 128]  # the one block size measured (aiconfigurator's fp8_block rows)
PRICED = "priced: fp8 (per tensor or channel), fp8 in 128 x 128 blocks, NVFP4, MXFP4 experts; an fp8 KV cache"


@dataclass(frozen=True)
class Precision:
    """What a checkpoint declares: None where it stores 16 bits."""

    weights: WeightFormat | None = None
    kv_cache: KvFormat | None = None
    experts: WeightFormat | None = None  # an MoE model's experts alone (gpt-oss's mxfp4)


def scheme_text(quantization: object) -> str:
    """The scheme a quantization object names, short: its method and format where it gives them."""
    if not isinstance(quantization, dict):
        return repr(quantization)
    parts = [str(quantization[k]) for k in ("quant_method", "quant_algo", "fmt", "bits") if k in quantization]
    return ", ".join(parts) or "declared"


def refused(source: object, where: str, quantization: object, why: str = "") -> PerfkitError:
    return PerfkitError(
        f"{source}: {where} ({scheme_text(quantization)}) declares a quantization that is not priced"
        + (f" ({why})" if why else "")
        + f"; {PRICED}"
    )


def modelopt_precision(settings: dict, source: object, where: str) -> Precision:
    algo = settings.get("quant_algo")
    if algo not in MODELOPT_ALGOS:
        raise refused(source, where, settings, f"quant_algo {algo!r}")
    # ModelOpt names it kv_cache_quant_algo; its config.json copy (quant_algo without a
    # quant_method, Qwen3-32B-FP8-Static-PerTensor's) kv_cache_scheme
    kv = settings.get("kv_cache_quant_algo", settings.get("kv_cache_scheme"))
    if kv not in (None, "FP8"):
        raise refused(source, where, settings, f"kv_cache_quant_algo {kv!r}")
    return Precision(MODELOPT_ALGOS[algo], KvFormat.FP8 if kv == "FP8" else None)


def fp8_float(scheme: object) -> bool:
    return isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float"


def compressed_tensors_precision(quantization: dict, source: object) -> Precision:
    groups = quantization.get("config_groups") or {}
    weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)]
    if not weights or not all(fp8_float(w) and w.get("strategy") in ("tensor", "channel") for w in weights):
        raise refused(source, "quantization_config", quantization, "weights other than fp8 per tensor or channel")
    kv = quantization.get("kv_cache_scheme")
    if kv is not None and not fp8_float(kv):
        raise refused(source, "quantization_config", quantization, "a kv_cache_scheme other than fp8")
    return Precision(WeightFormat.FP8, KvFormat.FP8 if kv is not None else None)


def config_precision(cfg: dict, source: object) -> Precision:
    """The precision a config.json object declares in `quantization_config` (16 bits where it
    declares none); one line where it declares a scheme that is not priced."""
    quantization = cfg.get("quantization_config")
    if quantization in (None, {}, False):
        return Precision()
    if not isinstance(quantization, dict):
        raise refused(source, "quantization_config", quantization)
    method = quantization.get("quant_method")
    if method == "fp8":
        block = quantization.get("weight_block_size")
        if block is not None and list(block) != BLOCK:
            raise refused(source, "quantization_config", quantization, f"weight_block_size {block}")
        return Precision(WeightFormat.FP8_BLOCK if block is not None else WeightFormat.FP8)
    if method == "modelopt" or (method is None and "quant_algo" in quantization):
        return modelopt_precision(quantization, source, "quantization_config")
    if method == "compressed-tensors":
        return compressed_tensors_precision(quantization, source)
    if method == "mxfp4":
        kept = " ".join(map(str, quantization.get("modules_to_not_convert") or []))
        if "self_attn" not in kept:
            raise refused(source, "quantization_config", quantization, "mxfp4 beyond the experts")
        return Precision(experts=WeightFormat.MXFP4)
    raise refused(source, "quantization_config", quantization)


def quant_file(config_file: Path) -> Path | None:
    """ModelOpt's quantization file for `config_file`: hf_quant_config.json in its folder, or
    <name>_hf_quant_config.json beside <name>_config.json (how NVIDIA aiconfigurator ships both
    files of one checkpoint in one folder); None where there is none."""
    name = config_file.name
    candidates = [config_file.with_name(MODELOPT_QUANT_FILE)]
    if name.endswith("_config.json"):
        candidates.append(config_file.with_name(name.removesuffix("config.json") + MODELOPT_QUANT_FILE))
    return next((path for path in candidates if path.is_file()), None)


def file_precision(config_file: Path) -> Precision | None:
    """The precision ModelOpt's file beside `config_file` declares; None where there is no such file."""
    path = quant_file(config_file)
    if path is None:
        return None
    settings = read_json(path, "quantization config")
    scheme = settings.get("quantization") if isinstance(settings, dict) else None
    if not isinstance(scheme, dict):
        raise refused(config_file, f"{path.name} beside it", scheme, "no quantization object")
    return modelopt_precision(scheme, config_file, f"{path.name} beside it")


def checkpoint_precision(cfg: dict, config_file: Path) -> Precision:
    """What a checkpoint declares: its config.json's quantization_config, else ModelOpt's file
    beside it; both declaring different precisions is one line."""
    declared = config_precision(cfg, config_file)
    beside = file_precision(config_file)
    if beside is None:
        return declared
    if declared != Precision() and declared != beside:
        raise PerfkitError(
            f"{config_file}: quantization_config and {MODELOPT_QUANT_FILE} beside it declare different precisions; "
            "keep the one the checkpoint was written with"
        )
    return beside
