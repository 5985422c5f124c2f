"""NVIDIA aiconfigurator as a peer: its static estimate of a point, and the model config it
prices, from the optional `aiconfigurator` package (pip install 'medusa-perfkit[aiconfigurator]').

The peer is aiconfigurator 0.12.0 (Apache-2.0), whose aiconfigurator-core ships the measured
tables this toolkit imported (profilers/measurements/IMPORTED-AICONFIGURATOR.md), so the two
read the same GEMMs, attention and collectives and differ only in how they compose a step.
`cli_estimate(mode="static")` prices a batch prefilled together and decoded together; its
per-op generation latencies are summed over the osl - 1 decoding steps, so a component's
TPOT share is that sum over osl - 1. The package is imported only when a peer estimate is
asked for: running the toolkit never needs it.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from perfmodel.base.errors import PerfkitError
from perfmodel.measured.aiconfigurator import SYSTEMS as MEASURED_SYSTEMS
from perfmodel.peer.static_batch import COMPONENTS

PACKAGE = "aiconfigurator"
INSTALL = "pip install 'medusa-perfkit[aiconfigurator]'"
# The toolkit's device keys and the peer's system names (the imported systems).
SYSTEMS = {device: system for system, device in MEASURED_SYSTEMS.items()}
# The peer's backend names are the toolkit's engine stacks.
BACKENDS = ("vllm", "sglang", "trtllm")


def check_installed() -> None:
    if importlib.util.find_spec(PACKAGE) is None or importlib.util.find_spec("aiconfigurator_core") is None:
        raise PerfkitError(f"the peer check needs NVIDIA aiconfigurator, which is not installed: {INSTALL}")


def model_config_path(model: str) -> Path:
    """The config.json the peer ships for a Hugging Face model id (e.g. meta-llama/Meta-Llama-3.1-8B),
    so that both sides price the same shapes."""
    check_installed()
    root = Path(importlib.util.find_spec("aiconfigurator_core").origin).parent / "model_configs"
    path = root / f"{model.replace('/', '--')}_config.json"
    if not path.is_file():
        known = sorted(p.name.removesuffix("_config.json").replace("--", "/") for p in root.glob("*_config.json"))
        raise PerfkitError(f"the peer ships no config for {model!r}; it has: {', '.join(known)}")
    return path


def peer_component(op_name: str) -> str:
    """The component (perfmodel.peer.static_batch.COMPONENTS) of one of the peer's op names."""
    if "mla" in op_name:  # a latent-attention module or its parts: attention, as the project's
        return "attention"
    if op_name.endswith("_gemm"):
        return "gemm"
    # its MoE layer, or (DeepSeek's) the layer's router, routed experts and dispatch overlapped with its shared expert
    if op_name.endswith(("_moe", "_moe_overlap")):
        return "moe"
    if op_name.endswith("_dispatch"):  # the MoE layer's collectives
        return "communication"
    if "attention" in op_name:
        return "attention"
    if op_name.endswith(("_ar", "_ar_1", "_ar_2", "_p2p", "_allreduce")):
        return "communication"
    return "elementwise"


@dataclass(frozen=True)
class PeerEstimate:
    """The peer's static estimate of one point: seconds, the TPOT by component, whether it
    found the batch out of memory, and the engine version whose tables it read."""

    ttft_s: float
    tpot_s: float
    tpot_parts: dict[str, float]
    oom: bool
    version: str
    ttft_communication_s: float = 0.0  # its prefill's collectives (all-reduces, an MoE layer's dispatch)


# The peer's quant-mode names of the toolkit's formats (perfmodel.base.precision; None: 16 bits).
PEER_GEMM = {None: "bfloat16", "fp8": "fp8", "fp8-block": "fp8_block", "nvfp4": "nvfp4"}
PEER_KV = {None: "bfloat16", "fp8": "fp8"}


def peer_split(latency) -> dict:
    """The expert split the project's latency source priced (perfmodel.latency.moe_table), as
    the peer's MoE tensor- and expert-parallel sizes, so both price the same rows; nothing for a
    dense model."""
    experts = getattr(latency, "experts", None)
    return {} if experts is None else {"moe_tp_size": experts.moe_tp, "moe_ep_size": experts.moe_ep}


def peer_quant(config) -> dict:
    """The quant modes to hand the peer for a quantized ModelConfig, so both price the same
    formats: left to itself the peer serves Qwen3-32B-FP8 (whose files declare no KV format)
    an fp8 KV cache, and ModelOpt's static FP8 as fp8_static, which it estimates without a
    table; told `fp8`, it reads the same measured rows. Nothing for a 16-bit model (its defaults)."""
    if config.weights is None and config.kv_cache is None:
        return {}
    modes = {"gemm_quant_mode": PEER_GEMM[config.weights], "kvcache_quant_mode": PEER_KV[config.kv_cache]}
    if config.moe is not None:  # an MoE checkpoint's experts in the format of its other layers
        modes["moe_quant_mode"] = PEER_GEMM[config.moe.experts_format or config.weights]
    return modes


def peer_estimate(
    model: str, device: str, stack: str, tp: int, batch: int, prompt_len: int, response_len: int, quant=None
):
    """aiconfigurator's static estimate of `batch` prompts of `prompt_len` tokens answered
    with `response_len` tokens on tp x `device`, with the engine `stack`'s tables; `quant`:
    peer_quant's modes (None: the peer's own inference)."""
    check_installed()
    if device not in SYSTEMS:
        raise PerfkitError(f"the peer has no system for {device!r}; choose from: {', '.join(SYSTEMS)}")
    if stack not in BACKENDS:
        raise PerfkitError(f"the peer prices engine stacks only, got {stack!r}; choose from: {', '.join(BACKENDS)}")
    # Its loaders log a line per fallback table they skip; those are about models we do not price.
    for name in ("aiconfigurator", "aiconfigurator_core"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from aiconfigurator.cli.api import cli_estimate

    result = cli_estimate(
        model,
        SYSTEMS[device],
        mode="static",
        backend_name=stack,
        isl=prompt_len,
        osl=response_len,
        batch_size=batch,
        tp_size=tp,
        **(quant or {}),
    )
    parts = dict.fromkeys(COMPONENTS, 0.0)
    for name, total_ms in result.summary.get_generation_latency_dict().items():
        parts[peer_component(name)] += total_ms / 1e3 / (response_len - 1)
    oom = bool(result.summary.check_oom())
    context = result.summary.get_context_latency_dict().items()
    collectives = sum(ms for name, ms in context if peer_component(name) == "communication") / 1e3
    return PeerEstimate(result.ttft / 1e3, result.tpot / 1e3, parts, oom, str(result.backend_version), collectives)
