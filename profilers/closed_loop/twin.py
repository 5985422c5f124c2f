"""The closed loop at a real model size: a performance twin (decoder.twin) measured against
its traced step, priced with this machine's measurements.

For one batch size:
1. measured: plain decoding and a Medusa tree of every recorded size, with dummy weights and
   the record's accepted path lengths replayed, timed interleaved batch of prompts by batch
   (decoder.runs.decode_interleaved, as the small closed loop times them), after one untimed
   run of each at the timed length (decoder.runs.warm_up); each setting's step time is its
   decoding time over its steps; a static step's warm-up (a CUDA graph's capture, a
   compilation) is its own column, warmup_s, in no step time;
2. measured per kernel class: the same settings run once more under torch.profiler, each
   aten operator's own time classed as decoder.trace classes the kernels of a trace, per
   step (a long run minus a one-token run, so the prefill cancels); what no kernel claims is
   the host's: Python, module calls and dispatch;
3. predicted: the traced step of every setting (decoder.trace on the meta device) priced
   by perfmodel.latency.traced with this machine's measurements: every distinct kernel call
   of the traces replayed here at its exact shapes, strides and dtypes
   (profilers.kernel_replay: weights and KV cache cold, activations warm), a round of
   every call between decoding batches so that both see the same machine; a call that
   cannot be replayed is priced by the shape model (GEMM and attention shapes timed here,
   memory-bound kernels at the measured copy bandwidth);
   one constant is calibrated, on the plain step only, never on a Medusa run: the in-step
   factor, measured plain step / its replayed kernels. It holds the host's time (Python,
   module calls, dispatch) and what a kernel loses inside a step against alone (caches
   and clocks shared with its neighbours); measured, it is about 1.1 on this CPU for
   plain and 64-token steps alike (a per-kernel constant instead under-predicted large
   trees by 5-9%);
4. speedup: a replay is deterministic, so the steps each setting takes are known before it
   runs (decoder.twin.Replay.steps); predicted speedup = plain steps x plain step time /
   (tree steps x predicted tree step time), against the measured tokens/s ratio.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from torch.profiler import ProfilerActivity, profile

from decoder.medusa import Decoder
from decoder.runs import decode_interleaved, warm_up
from decoder.static_step import check_launch
from decoder.trace import trace_step
from decoder.trace_ops import ATTENTION_BACKENDS, ATTENTIONS, KIND_OF, TORCH_DTYPES
from decoder.tree import Drafting
from decoder.twin import Replay, ReplayRecord, dummy_checkpoint, native_dtype, random_prompts
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.hardware.specs import find_spec
from perfmodel.latency.kinds import KINDS, kernel_rows
from perfmodel.latency.pipeline import HostCosts, price_pipeline, run_pipeline
from perfmodel.models.config import load_model
from profilers.closed_loop.capture import WARMUP_COLUMN
from profilers.closed_loop.config import TARGET_ERROR
from profilers.closed_loop.streamed_bytes import plain_step_bytes
from profilers.closed_loop.tree_kind import TreeKind
from profilers.closed_loop.twin_pricing import priced_step, this_machine
from profilers.device import DeviceInfo, check_device, cpu_info, cuda_info, torch_threads
from profilers.kernel_replay import KernelTimes

TWIN_DTYPES = tuple(TORCH_DTYPES)  # fp16 for a GPU; a CPU runs bf16 where it has it, else fp32
__all__ = ["TWIN_DTYPES", "TwinConfig", "native_dtype", "twin_loop"]
# Which forward pass a run's steps ran (its `forward` column): runs from before the fused
# static step (decoder.fused) have no column and ran the reference model's.
FORWARD_COLUMN, FUSED, REFERENCE = "forward", "fused", "reference"
HOST = "host"  # what no kernel of a step claims: Python, module calls, dispatch
PROFILED_TOKENS = 1  # the short run whose profile is subtracted (prefill and one step)


@dataclass(frozen=True)
class TwinConfig:
    model: str  # a config.json or a folder holding one
    replay: Path  # a decoder.measure record with path_lengths
    batch: int = 1
    sizes: tuple[int, ...] = ()  # tree sizes to run; () = every size the record holds
    dtype: str = "bf16"
    device: str = "cpu"
    prompts: int = 8
    prompt_len: int = 128
    new_tokens: int = 32
    rounds: int = 2
    threads: int = 1
    budget_s: float = 0.3  # timer budget per GEMM or attention shape
    seed: int = 0
    launch: Launch = Launch.EAGER  # how the twin's steps run (perfmodel.base.launch)
    # python -m profilers.host_dispatch's JSON of this GPU host: each step priced as host and
    # device queues (perfmodel.latency.pipeline), no factor calibrated; None: the in-step factor
    host_dispatch: Path | None = None
    profile: bool = True  # measure each kernel class's share under torch.profiler (a slow pass on a GPU)

    def __post_init__(self) -> None:
        if self.dtype not in TORCH_DTYPES:
            raise PerfkitError(f"--dtype {self.dtype!r}: the twin runs {', '.join(TORCH_DTYPES)}")
        for name in ("batch", "prompts", "prompt_len", "new_tokens", "rounds", "threads"):
            if getattr(self, name) < 1:
                raise PerfkitError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompts < self.batch:
            raise PerfkitError(f"--prompts {self.prompts} is fewer than batch {self.batch}: give at least one batch")
        check_device(self.device)
        if any(n < 2 for n in self.sizes):
            raise PerfkitError(f"tree sizes are tokens per step with the root, so >= 2; got {list(self.sizes)}")
        object.__setattr__(self, "launch", Launch.parse(self.launch))
        check_launch(self.launch, self.device)
        if self.host_dispatch is not None and self.device != "cuda":
            raise PerfkitError(
                "--host-dispatch prices a GPU step's host and device queues; a CPU runs its kernels on the host's own "
                "thread (the in-step factor prices it): leave it out"
            )

    @property
    def pipelined(self) -> bool:
        """Whether steps are priced as host and device queues rather than calibrated."""
        return self.host_dispatch is not None

    @property
    def context(self) -> int:
        """Mean tokens in the cache over a generation: prompt plus half the response."""
        return self.prompt_len + self.new_tokens // 2

    @property
    def batches(self) -> int:
        return -(-self.prompts // self.batch) * self.rounds


def kernel_class(name: str) -> str:
    """The trace's kernel class of a profiled aten operator; HOST for what launches none."""
    packet = name.removeprefix("aten::")
    if packet in ATTENTIONS or packet in ATTENTION_BACKENDS:
        return "attention"
    if packet == "_local_scalar_dense":
        return "host_sync"
    return KIND_OF.get(packet, HOST)


def fresh(setting: dict) -> dict:
    """A setting whose replay has its own cursor, from the first sequence (decoder.twin.Replay)."""
    return {**setting, "replay": Replay(setting["replay"].lengths)} if "replay" in setting else setting


def profiled_classes(decoder: Decoder, prompts, settings: dict, config: TwinConfig) -> dict:
    """(kind, size) -> seconds per step of each kernel class, measured under torch.profiler
    (a run of new_tokens minus a run of PROFILED_TOKENS, over the steps between them), for
    the plain step and the largest tree: each aten operator's own CPU time on a CPU, the
    time of the GPU kernels it launched on a GPU (what is left of the step, the host's, is
    then the GPU's idle time)."""
    gpu = config.device == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]
    out = {}
    for key, setting in settings.items():
        if key[1] not in (1, max(n for _, n in settings)):
            continue  # the plain step and the largest tree: the two ends, at a tenth of the time
        totals, steps = [], []
        for tokens in (PROFILED_TOKENS, config.new_tokens):
            if tokens == PROFILED_TOKENS:  # its shape warm too (the long run's is): a capture in one would not cancel
                decoder.generate(prompts[: config.batch], tokens, **fresh(setting))
            with profile(activities=activities) as prof:
                result = decoder.generate(prompts[: config.batch], tokens, **fresh(setting))
            seconds = dict.fromkeys((*KINDS, HOST), 0.0)
            for event in prof.key_averages():
                own = event.self_device_time_total if gpu else event.self_cpu_time_total
                seconds[kernel_class(event.key)] += own * 1e-6
            totals.append(seconds)
            steps.append(result.steps)
        out[key] = {c: (totals[1][c] - totals[0][c]) / (steps[1] - steps[0]) for c in totals[0]}
    return out


def twin_loop(config: TwinConfig, log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per tree size comparison, per kernel class comparison, summary) for one batch size."""
    record = ReplayRecord.load(config.replay)
    sizes = list(config.sizes) or [n for n in record.sizes if n > 1]
    for n in sizes:
        record.tree(n)  # refused here, before minutes of work, if the record lacks it
    model = load_model(config.model)
    torch_dtype = TORCH_DTYPES[config.dtype]
    ckpt = dummy_checkpoint(
        config.model, torch_dtype, medusa_heads=record.accuracy.shape[0], seed=config.seed, device=config.device
    )
    decoder = Decoder(ckpt, config.device)
    model = dataclasses.replace(model, medusa_heads=len(ckpt.heads))
    prompts = random_prompts(ckpt.config.vocab_size, config.prompts, config.prompt_len, config.seed)
    params = sum(p.numel() for p in (*ckpt.model.parameters(), *ckpt.heads.parameters()))
    launch = {"launch": config.launch}
    settings = {(TreeKind.PLAIN, 1): launch} | {
        (TreeKind.STATIC, n): {"drafting": Drafting(record.tree(n)), "replay": record.replay(n), **launch}
        for n in sizes
    }
    with torch_threads(config.threads):
        log(f"{model.name} twin, {params / 1e9:.2f} B parameters with heads, {config.dtype}, batch {config.batch}")
        traces = {
            key: trace_step(model, config.batch, config.context, key[1], config.dtype, launch=config.launch)
            for key in settings
        }
        info = cuda_info()[0] if config.device == "cuda" else cpu_info()
        kernels = KernelTimes.of(traces.values(), config.device, info.cache_bytes)
        log(f"{len(kernels.calls)} distinct kernel calls in the traced steps, replayed between decoding batches")
        warm = warm_up(decoder, prompts, config.batch, config.new_tokens, settings)
        log(f"timing plain decoding and trees of {', '.join(map(str, sizes))} tokens, {config.rounds} round(s) ...")
        between = kernels.round if config.device == "cpu" else None  # a GPU times its calls after, by CUDA events
        timed = {key: fresh(setting) for key, setting in settings.items()}
        runs = decode_interleaved(decoder, prompts, config.batch, config.new_tokens, timed, config.rounds, between)
        replayed = kernels.times()
        classes = {}
        if config.profile:
            log("profiling every setting's kernels by class ...")
            classes = profiled_classes(decoder, prompts, settings, config)
        source = this_machine(info, torch_dtype, config.budget_s, measure=bool(kernels.failed))
        priced = {key: priced_step(trace, source, config.dtype, replayed) for key, trace in traces.items()}
    for key, result in warm.items():  # the setting's warm-up, all of it outside its timed steps
        runs[key].warmup_s += result.warmup_s
    out, class_table, summary = compare(config, model, runs, classes, priced, source, settings, kernels)
    summary.update(streamed(ckpt, decoder, config, summary["plain_step_s"], info))
    return out, class_table, summary


def streamed(ckpt, decoder: Decoder, config: TwinConfig, plain_step_s: float, info: DeviceInfo) -> dict:
    """What the plain step reads from memory (the model's weights once, of the embedding table
    only its tokens' rows unless the LM head is tied to it; the KV cache it attends over: the
    context for the eager loop, the whole allocation for a static step: streamed_bytes) and the
    bandwidth that makes, beside the datasheet's where the device has a spec."""
    tokens = (
        decoder._max_len([[0] * config.prompt_len], config.new_tokens, 1) if config.launch.static else config.context
    )
    read = plain_step_bytes(ckpt.model, config.batch, tokens)
    achieved = read / plain_step_s
    datasheet = find_spec(info.spec_key).bandwidth if info.kind == "cuda" and info.spec_key else None
    return {
        "plain_bytes_per_step": read,
        "plain_bandwidth_gb_s": achieved / 1e9,
        "hbm_fraction": achieved / datasheet if datasheet else None,
    }


def pipelined_step(table: pd.DataFrame, host: HostCosts, launch: Launch) -> float:
    """A priced step through the host and device queues (perfmodel.latency.pipeline): the
    eager and static steps issue every kernel from Python, the static one reading its
    verdict back once at the end; a graph step issues one launch (priced as one op) for all
    of its kernels, which then run back to back, and reads back the same."""
    if launch is Launch.GRAPH:
        kernels = table["time_s"].to_numpy(dtype=float)
        issue = np.zeros(len(kernels) + 1)
        issue[0] = host.issue("elementwise")
        issue[-1] = host.issue("host_sync")
        sync = np.zeros(len(kernels) + 1, dtype=bool)
        sync[-1] = True
        return run_pipeline(issue, np.append(kernels, 0.0), sync).total_s
    if launch.static:  # the readback after the step
        table = pd.concat([table, pd.DataFrame({"kind": ["host_sync"], "time_s": [0.0], "source": ["readback"]})])
    return price_pipeline(table, host).total_s


def compare(config: TwinConfig, model, runs: dict, classes: dict, priced: dict, source, settings, kernels) -> tuple:
    plain = runs[(TreeKind.PLAIN, 1)]
    plain_step = plain.decode_s / plain.steps
    priced_plain = priced[(TreeKind.PLAIN, 1)]
    host = HostCosts.from_json(config.host_dispatch) if config.pipelined else None
    if host is not None:  # nothing calibrated: every step, the plain one too, predicted
        in_step = 1.0
        predicted_steps_s = {key: pipelined_step(table, host, config.launch) for key, table in priced.items()}
    else:
        in_step = plain_step / priced_plain["time_s"].sum()  # the one calibrated constant (module doc)
        predicted_steps_s = {key: float(table["time_s"].sum()) * in_step for key, table in priced.items()}
    predicted_plain = predicted_steps_s[(TreeKind.PLAIN, 1)]
    plain_steps = config.batches * config.new_tokens  # one token a step
    rows, class_rows = [], []
    for key, result in runs.items():
        kind, size = key
        predicted_steps = (
            plain_steps
            if kind == TreeKind.PLAIN
            else settings[key]["replay"].steps(config.batch, config.new_tokens, config.batches)
        )
        table = priced[key]
        predicted_step = predicted_steps_s[key]
        measured_step = result.decode_s / result.steps
        measured_speedup = result.tokens_per_s / plain.tokens_per_s
        predicted_speedup = (plain_steps * predicted_plain) / (predicted_steps * predicted_step)
        rows.append(
            {
                "model": model.name,
                "dtype": config.dtype,
                "launch": str(config.launch),
                # the forward its steps ran: decoder.fused's in every static regime, the reference's eager
                FORWARD_COLUMN: FUSED if config.launch.static else REFERENCE,
                "pricing": f"pipeline ({host.origin})" if host is not None else "in-step factor",
                "batch": config.batch,
                "tree_size": size,
                "context": config.context,
                "kernels": len(kernel_rows(table)),
                "measured_steps": result.steps,
                "predicted_steps": predicted_steps,
                "tokens_per_step": result.new_tokens / (result.steps * config.batch),
                "measured_step_s": measured_step,
                # the setting's warm-up before its timed steps (a graph's capture, a compilation), in no step time
                WARMUP_COLUMN: result.warmup_s,
                "predicted_step_s": predicted_step,
                "step_error": predicted_step / measured_step - 1,
                "measured_overhead": measured_step / plain_step,
                "predicted_overhead": predicted_step / predicted_plain,
                "measured_speedup": measured_speedup,
                "predicted_speedup": predicted_speedup,
                "error": predicted_speedup / measured_speedup - 1,
            }
        )
        by_kind = table.groupby("kind")["time_s"].sum()
        counts = table.groupby("kind").size()
        if key not in classes:
            continue
        measured_classes = dict(classes[key])
        measured_classes[HOST] = measured_step - sum(v for c, v in measured_classes.items() if c != HOST)
        for cls in (*KINDS, HOST):
            predicted = float(by_kind.get(cls, 0.0)) if cls != HOST else predicted_step - table["time_s"].sum()
            class_rows.append(
                {
                    "batch": config.batch,
                    "tree_size": size,
                    "kernel_class": cls,
                    "kernels": int(counts.get(cls, 0)) if cls != HOST else 0,
                    "measured_s": measured_classes[cls],
                    "predicted_s": predicted,
                    "error": predicted / measured_classes[cls] - 1 if measured_classes[cls] > 0 else float("nan"),
                }
            )
    summary = {
        "plain_step_s": plain_step,
        "priced_plain_step_s": float(priced_plain["time_s"].sum()),
        "in_step_factor": in_step,
        "launch": str(config.launch),
        "host_dispatch": str(config.host_dispatch) if host is not None else None,
        "measured_per_op_overhead_s": source.params.kernel_overhead_s,
        "bandwidth_gb_s": source.spec.bandwidth / 1e9,
        "gemm_shapes_timed": len(source.gemms),
        "calls_replayed": len(kernels.calls),
        "calls_not_replayed": len(kernels.failed),
        "replay_rounds": kernels.rounds,
    }
    out = pd.DataFrame(rows)
    summary["max_abs_error"] = float(out.loc[out["tree_size"] > 1, "error"].abs().max())
    summary["within_target"] = summary["max_abs_error"] <= TARGET_ERROR
    return out, pd.DataFrame(class_rows), summary
