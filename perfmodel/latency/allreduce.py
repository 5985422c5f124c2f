"""Tensor-parallel all-reduce time: measured tables where there are some (this toolkit's
own or imported), a ring model from the spec's interconnect bandwidth elsewhere.

Imported tables (`measured_tables`, all read by perfmodel.measured.vidur.read_table), and ours:
- **nccl-<version>**: NCCL's own benchmark (nccl-tests all_reduce_perf, fp16, one node of
  2, 4 and 8 GPUs, 512 B-512 MiB) as NVIDIA's aiconfigurator-core publishes it (Apache-2.0),
  for a100-sxm, h100-sxm, h200 and l40s; shipped under
  `profilers/measurements/<device>/aiconfigurator/nccl-<version>/` (perfmodel.measured.aiconfigurator);
- **vidur**: Vidur's tables (github.com/microsoft/vidur, MIT licence), all-reduces timed
  inside PyTorch on DGX A100 / DGX H100 and on 4-GPU pairwise-NVLink nodes, shipped under
  `profilers/measurements/<device>/imported/all_reduce-*.csv` (perfmodel.measured.vidur).
- **<engine>-<version>** (vllm, sglang, trtllm): the engine's own all-reduce (vLLM's and
  SGLang's custom all-reduce kernels, TensorRT-LLM's AllReduce op), as aiconfigurator-core
  measured it inside that engine, its CUDA-graph kernel: what a decoding step of that engine
  runs for the small messages of decoding (3.6-5 us at 8192 elements on 8 H100s, where
  NCCL's all_reduce_perf takes 19 us). Shipped in the engine stack's folder
  (`<device>/aiconfigurator/<engine>-<version>/custom_all_reduce.parquet`); the step of an
  engine stack is priced with it (perfmodel.latency.tensor_parallel);
- **torch-<backend>**: this toolkit's own, `python -m profilers.allreduce` timing
  torch.distributed all_reduce (gloo on a CPU, nccl on GPUs) on the machine it runs on,
  under `<measurements>/<device>/allreduce/` (perfmodel.measured.collectives).

`all_reduce_source(device, topology, stack)` picks one: by default, for each worker count,
the device's own torch.distributed measurements where there are some (the deployment's
own stack and machine), else its NCCL tables (the newest NCCL version that measured that
count), else Vidur's DGX table; with none of these, the ring model. A CPU has no ring
model: only its own measurements time its all-reduces. Among the imported tables NCCL's
are the default because they cover every imported device with one method, and time what
a decoding step runs: back-to-back all-reduces on a stream, averaged over 100-1000 calls
and over the ranks (nccl-tests). Vidur times single eager calls after a barrier, whose
kernel time includes waiting for the other ranks: at a decoding step's message sizes
1.2-2.7x NCCL's in the median, up to 5.6x for small messages
(`python -m perfmodel.allreduce_compare` prints the ratios).

The ring model's latency and efficiency are fitted on Vidur's tables
(perfmodel.latency.allreduce_fit); `python -m perfmodel.allreduce_compare` prints the fits
and the model's error against every table.

Everything here is a pure function of its arguments and of the measured tables (the shipped
ones, NCCL tables a user imported and all-reduces measured into the measurements home).
"""

from __future__ import annotations

import numpy as np

from perfmodel.base.dtypes import element_bytes
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import HardwareSpec, find_spec
from perfmodel.latency.allreduce_ring import RingAllReduce, as_result
from perfmodel.latency.allreduce_tables import (
    ENGINE_NAMES,
    TOPOLOGY_TEXT,
    VIDUR,
    Device,
    MeasuredAllReduce,
    engine_all_reduce_stack,
    engine_tables,
    measure_command,
    measured_source,
    nccl_source,
    nccl_tables,
    own_tables,
    stack_names,
    vidur_tables,
)
from perfmodel.measured.collectives import (
    STACK_PREFIX,
)
from perfmodel.measured.device_view import device_key, is_cpu_name
from perfmodel.measured.evidence import DeviceEvidence, device_evidence
from perfmodel.measured.vidur import SHIPPED_TABLES
from perfmodel.models.config import ModelConfig

RING = "ring"
AllReduceSource = MeasuredAllReduce | RingAllReduce  # what all_reduce_source gives
TOPOLOGIES = (*TOPOLOGY_TEXT, RING)


# Message sizes typical of decoding: batch x query tokens x hidden x 2 bytes spans about
# 8 KiB (1 token, hidden 4096) to tens of MiB (a few hundred tree tokens x batch, hidden 8192).
DECODE_BYTES = (8 * 1024, 64 * 1024**2)


def _device(device: str | HardwareSpec | DeviceEvidence) -> tuple[Device, HardwareSpec | None]:
    """The device's evidence (its key where it has no spec: a CPU named `cpu` or `cpu-...`)
    and its spec, None for such a CPU."""
    if isinstance(device, DeviceEvidence):
        return device, device.spec
    if isinstance(device, HardwareSpec):
        return device_evidence(device), device
    if is_cpu_name(str(device)):
        return device_key(str(device), None), None
    spec = find_spec(device)
    return device_evidence(spec), spec


def _key(device: Device) -> str:
    return device.key if isinstance(device, DeviceEvidence) else device


def _ring(key: str, spec: HardwareSpec | None) -> RingAllReduce:
    if spec is None or is_cpu_name(key):
        raise PerfkitError(
            f"{key}: no all-reduce measurements are stored, and a CPU has no interconnect for the ring model; "
            f"measure them (a minute): {measure_command(2)} (--ranks: the tensor-parallel degree)"
        )
    return RingAllReduce.for_spec(spec)


def default_source(
    device: Device, spec: HardwareSpec | None, dtype: str | None = None
) -> MeasuredAllReduce | RingAllReduce:
    """For each worker count the device's own measurements where there are some, else the
    tables of its first imported stack (nccl, else vidur); the ring model where it has none.

    Own rows come first: they time the stack and machine the deployment runs. The ring model
    does not fill in worker counts a measurement lacks (a label names one source per count)."""
    key = _key(device)
    imported = [n for n in stack_names(device) if not n.startswith(STACK_PREFIX)]
    base = {} if not imported else vidur_tables(device) if imported[0] == VIDUR else nccl_tables(device)
    tables = {**base, **own_tables(key, dtype=dtype)}
    return MeasuredAllReduce.of(tables) if tables else _ring(key, spec)


def all_reduce_source(
    device: str | HardwareSpec | DeviceEvidence,
    topology: str | None = None,
    stack: str | None = None,
    dtype: str | None = None,
) -> MeasuredAllReduce | RingAllReduce:
    """How to time all-reduces on `device` (its evidence, a name, key or spec; `cpu` is this machine's CPU).

    stack None (the default): per worker count, the device's own torch.distributed
    measurements (python -m profilers.allreduce) where stored, else its NCCL tables where
    shipped (a100-sxm, h100-sxm, h200, l40s; per GPU count the newest NCCL version measuring
    it), else Vidur's DGX table; with none of them the ring model from the spec's
    interconnect (a CPU has none: an error saying how to measure). stack 'torch-gloo' /
    'torch-nccl': our own measurements of that backend; 'nccl' / 'nccl-<version>': those
    NCCL tables; 'vllm' / 'sglang' / 'trtllm' (or with their version): that engine's own
    all-reduce; 'vidur': Vidur's table of `topology` ('dgx' unless given). topology
    'dgx' / 'pairwise_nvlink': Vidur's table of that node; 'ring': the model, always (no
    stack). A stack or topology the device was not measured in is an error naming those it
    was. dtype: the activations' dtype, whose own rows are preferred where a worker count was
    measured in several. The result has `time(bytes, workers)` and a `label` saying which it is.
    """
    if topology is not None and topology not in TOPOLOGIES:
        raise PerfkitError(f"unknown all-reduce topology {topology!r}; choose one of: {', '.join(TOPOLOGIES)}")
    device, spec = _device(device)
    key = _key(device)
    if topology == RING:
        if stack is not None:
            raise PerfkitError(f"topology='ring' is the ring model, from the spec: it takes no stack, got {stack!r}")
        return _ring(key, spec)
    if topology is not None:  # one of Vidur's nodes
        if stack not in (None, VIDUR):
            raise PerfkitError(f"topology {topology!r} is a Vidur node; stack {stack!r} has none (stack 'vidur' has)")
        if topology not in SHIPPED_TABLES.get(key, {}):
            shipped = "; ".join(f"{k} ({', '.join(t)})" for k, t in SHIPPED_TABLES.items())
            raise PerfkitError(
                f"no measured {topology} all-reduce table for {key}; measured: {shipped}; "
                "topology='ring' models it from the spec's interconnect"
            )
        return measured_source(device, topology)
    if stack is None:
        return default_source(device, spec, dtype)
    names = stack_names(device)
    stack = engine_all_reduce_stack(device, stack) or stack  # an engine's name: its stack here
    if stack not in names:
        raise PerfkitError(_unknown_stack(key, stack, names))
    if stack.startswith(STACK_PREFIX):
        return MeasuredAllReduce.of(own_tables(key, stack, dtype))
    if stack.split("-")[0] in ENGINE_NAMES:
        table = next(t for t in engine_tables(device) if t.stack == stack)
        return MeasuredAllReduce.of(dict.fromkeys(table.curves(), table))
    return measured_source(device) if stack == VIDUR else nccl_source(device, stack)


def _unknown_stack(device_key: str, stack, names: list[str]) -> str:
    if not names:
        default = "measure them" if is_cpu_name(device_key) else "None: the ring model"
        return f"all-reduce stack {stack!r}: {device_key} has no measured all-reduce tables ({default})"
    return f"no all-reduce stack {stack!r} on {device_key}; choose one of: {', '.join(names)} (None: {names[0]})"


def tp_comm_time_per_step(model: ModelConfig, tp: int, tokens, dtype: str, source) -> float | np.ndarray:
    """Seconds of tensor-parallel all-reduce per decoding step (tokens may be an array).

    Megatron-style tensor parallelism all-reduces each layer's output twice: after
    attention's output projection and after the MLP's down projection, each a
    tokens x hidden activation of `dtype` (tokens = batch x query length, the tree's tokens
    for a Medusa step). Per step: 2 x num_layers x source.time(tokens x hidden x element
    bytes, tp). Not counted: gathering the LM head's and Medusa heads' logits, the
    embedding's all-reduce. `dtype` is that of the activations reduced: a model with fp8 or
    int8 weights usually reduces fp16/bf16 activations, so pass that.
    """
    t = np.asarray(tokens, dtype=float)
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        raise PerfkitError(f"tokens per step must be >= 0, got {t[bad].flat[0]:g}")
    nbytes = t * model.hidden_size * element_bytes(dtype)
    return as_result(2 * model.num_layers * np.asarray(source.time(nbytes, tp)))
