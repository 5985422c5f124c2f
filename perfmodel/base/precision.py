"""How a checkpoint stores its numbers beside the dtype it computes in: the format of its
decoder layers' linear weights (and the activations their GEMMs read) and the format of its KV
cache. The dtype (perfmodel.base.dtypes) stays the 16-bit type of everything else: embeddings,
the LM head, norms, attention's queries and the activations between layers.

- fp8: W8A8 with one scale per tensor (NVIDIA ModelOpt's FP8, vLLM's and compressed-tensors'
  static fp8): one byte a weight.
- fp8-block: W8A8 with one fp32 scale per 128 x 128 block of a weight (DeepSeek-V3's and
  Qwen3-FP8's `weight_block_size` [128, 128]) and per 128 activations of a row.
- nvfp4: W4A4 in NVIDIA's FP4 (E2M1) with one FP8 (E4M3) scale per 16 weights and an fp32
  scale per tensor (ModelOpt's NVFP4): Blackwell's tensor cores run it.
- mxfp4: W4A16 in the OCP microscaling FP4 (E2M1) with one 8-bit power-of-two (E8M0) scale per
  32 weights, dequantized to 16 bits for the 16-bit tensor cores (gpt-oss's experts): only an
  MoE model's experts are priced in it (the engines' MoE tables measured it; no GEMM table did).

A KV cache in fp8 stores keys and values in one byte each (vLLM's `--kv-cache-dtype fp8`,
ModelOpt's `kv_cache_quant_algo: FP8`).

The names are the tables' (aiconfigurator-core's gemm_dtype fp8, fp8_block and nvfp4, as
perfmodel.measured.aiconfigurator keeps them), so a format finds its measured rows by name.
"""

from __future__ import annotations

from enum import StrEnum

from perfmodel.base.errors import PerfkitError

SIXTEEN_BIT = ("bf16", "fp16")  # 16 bits: the dtype's own format (same tensor rate; the grids hold bf16)


class WeightFormat(StrEnum):
    """A quantized format of the decoder layers' linear weights (16 bits: no format)."""

    FP8 = "fp8"
    FP8_BLOCK = "fp8-block"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"


class KvFormat(StrEnum):
    """A quantized format of the KV cache (16 bits: no format)."""

    FP8 = "fp8"


# Bytes a weight takes in each format, its scales included (fp8's one scale per tensor is
# nothing beside millions of weights).
WEIGHT_BYTES = {
    WeightFormat.FP8: 1.0,
    WeightFormat.FP8_BLOCK: 1.0 + 4 / (128 * 128),
    WeightFormat.NVFP4: 0.5 + 1 / 16,
    WeightFormat.MXFP4: 0.5 + 1 / 32,
}
KV_BYTES = {KvFormat.FP8: 1}
# The peak (a key of a spec's peak_tflops) each format's GEMMs run at: a device whose spec has
# no such peak has no tensor cores for the format, and cannot run it.
WEIGHT_PEAK = {
    WeightFormat.FP8: "fp8",
    WeightFormat.FP8_BLOCK: "fp8",
    WeightFormat.NVFP4: "fp4",
    WeightFormat.MXFP4: "bf16",  # W4A16: dequantized into 16-bit tensor-core math
}

WEIGHT_CHOICES = (*SIXTEEN_BIT, *WeightFormat)
KV_CHOICES = (*SIXTEEN_BIT, *KvFormat)


def weight_format(value: str | None) -> WeightFormat | None:
    """A weight format by name: None (or a 16-bit name) for unquantized weights; one line
    naming the value and the choices otherwise."""
    if value is None or value in SIXTEEN_BIT:
        return None
    if value not in WeightFormat._value2member_map_:
        raise PerfkitError(f"weights {value!r}: choose one of {', '.join(WEIGHT_CHOICES)}")
    return WeightFormat(value)


def kv_format(value: str | None) -> KvFormat | None:
    """A KV-cache format by name: None (or a 16-bit name) for the dtype's own."""
    if value is None or value in SIXTEEN_BIT:
        return None
    if value not in KvFormat._value2member_map_:
        raise PerfkitError(f"kv cache {value!r}: choose one of {', '.join(KV_CHOICES)}")
    return KvFormat(value)


def weight_bytes(fmt: WeightFormat | None, dtype_bytes: float) -> float:
    """Bytes one linear weight takes: the format's, or the dtype's where it has none."""
    return dtype_bytes if fmt is None else WEIGHT_BYTES[fmt]


def kv_bytes(fmt: KvFormat | None, dtype_bytes: float) -> float:
    """Bytes one cached key or value element takes."""
    return dtype_bytes if fmt is None else KV_BYTES[fmt]


def check_runs_on(weights: WeightFormat | None, spec) -> None:
    """One line where the device of `spec` (a HardwareSpec) has no tensor cores for the weight
    format asked: fp8 on an A100, nvfp4 on a Hopper. (An fp8 KV cache is storage that any
    device can hold; where it is priced from is the attention tables' business.)"""
    if weights is not None and WEIGHT_PEAK[weights] not in spec.peak_tflops:
        have = ", ".join(k for k in spec.peak_tflops if k not in ("fp32", "tf32"))
        raise PerfkitError(
            f"weights {weights}: {spec.name} ({spec.key}) cannot run them (its spec has no {WEIGHT_PEAK[weights]} "
            f"tensor peak; it runs {have})"
        )


def describe(weights: WeightFormat | None, kv_cache: KvFormat | None, experts: WeightFormat | None = None) -> str:
    """The precision in words, for a label: '' where nothing is quantized (`experts`: an MoE
    model's experts stored apart, gpt-oss's mxfp4)."""
    parts = [f"{weights} weights"] if weights else []
    parts += [f"{experts} experts"] if experts else []
    parts += [f"{kv_cache} KV cache"] if kv_cache else []
    return ", ".join(parts)
