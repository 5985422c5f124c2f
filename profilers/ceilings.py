"""The device's empirical ceilings: achievable memory bandwidth and matmul FLOP/s per dtype.

Bandwidth is measured on arrays far larger than the last-level cache: STREAM copy
(a = b, 2 x N x 4 bytes moved) and triad (a = b + s*c, 3 x N x 4 bytes), and a read-only
stream, a matrix-vector product (N x 4 bytes), the access pattern of every decode-time
linear layer; reads alone run faster than copies on many machines. Peak FLOP/s is the
best of a few large square matmuls (2n^3 FLOPs) per dtype the device can run. On a CPU
these are the only ceilings there are; on a GPU the roofline draws them beside the
datasheet's.
"""

from __future__ import annotations

import time

from perfmodel.base.errors import PerfkitError
from perfmodel.base.units import flops_text
from perfmodel.hardware.ceilings import Ceilings
from profilers.device import DeviceInfo, available_bytes
from profilers.timer import TimerConfig, Timing, time_cuda_events, time_wall

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp8": "float8_e4m3fn", "int8": "int8"}
CEILING_TIMER = TimerConfig(warmup=2, min_reps=5, max_reps=50, target_noise=0.01, budget_s=1.5, flush_cache=False)


def _timer(info: DeviceInfo):
    return time_cuda_events if info.kind == "cuda" else time_wall


def _sync(info: DeviceInfo) -> None:
    if info.kind == "cuda":
        import torch

        torch.cuda.synchronize()


def measure_bandwidth(info: DeviceInfo, config: TimerConfig = CEILING_TIMER) -> dict[str, Timing]:
    import torch

    # Far beyond the last-level cache, within an eighth of free memory for three arrays.
    target = max(8 * info.cache_bytes, 256 << 20) if info.kind == "cpu" else max(16 * info.cache_bytes, 1 << 30)
    size = min(target, available_bytes(info) // 8) // 4 // 4096 * 4096  # whole rows of 4096 for the read
    if size * 4 < 4 * info.cache_bytes:
        raise PerfkitError(f"not enough free memory to measure bandwidth beyond the {info.cache_bytes >> 20} MiB cache")
    a, b, c = (torch.ones(size, dtype=torch.float32, device=info.kind) for _ in range(3))
    matrix, vector = a.view(-1, 4096), torch.ones(4096, device=info.kind)
    timings = {
        "copy": _timer(info)(lambda: a.copy_(b), config),
        "triad": _timer(info)(lambda: torch.add(b, c, alpha=3.0, out=a), config),
        "read": _timer(info)(lambda: torch.mv(matrix, vector), config),
    }
    moved = {"copy": 2 * size * 4, "triad": 3 * size * 4, "read": matrix.numel() * 4}
    return {name: (moved[name], t) for name, t in timings.items()}


def _matmul_call(info: DeviceInfo, dtype: str, n: int):
    """A function doing one n x n x n matmul in `dtype`, or a PerfkitError saying why not."""
    import torch

    device = info.kind
    if dtype == "fp8":
        if not hasattr(torch, "_scaled_mm"):
            raise PerfkitError("this torch has no torch._scaled_mm")
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as required
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if dtype == "int8":
        a = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(n, n, dtype=torch_dtype, device=device)
    b = torch.randn(n, n, dtype=torch_dtype, device=device)
    out = torch.empty(n, n, dtype=torch_dtype, device=device)
    return lambda: torch.mm(a, b, out=out)


def measure_matmul_peak(info: DeviceInfo, dtype: str, config: TimerConfig = CEILING_TIMER) -> tuple[int, Timing]:
    """(FLOPs of one call, its timing) for the fastest of a few large square matmuls.

    GPUs: n = 8192. CPUs: n = 256, 512, ... 4096 while the next size (8x the work) would
    take under a third of the timer's budget a call (half a second at CEILING_TIMER's 1.5 s);
    library blocking makes the best size machine-dependent, and the ceiling is what is
    reachable. Starting small keeps a dtype the CPU emulates (bf16 and fp16 without native
    support: 2 s for one 1024-square product on an AVX2 core) to a second or two.
    """
    sizes = (8192,) if info.kind == "cuda" else (256, 512, 1024, 2048, 4096)
    best = None
    for n in sizes:
        call = _matmul_call(info, dtype, n)
        try:
            call()
            _sync(info)
        except (RuntimeError, TypeError) as exc:
            raise PerfkitError(str(exc).splitlines()[0]) from None
        timing = _timer(info)(call, config)
        if best is None or 2 * n**3 / timing.median_s > best[0] / best[1].median_s:
            best = (2 * n**3, timing)
        if 8 * timing.median_s > config.budget_s / 3:
            break
    return best


def measure_kernel_overhead(info: DeviceInfo, config: TimerConfig = CEILING_TIMER) -> Timing:
    """The time of the smallest op a decoding step makes: a one-token linear layer on a
    64-wide input, whose work (8 KFLOP, 16 KiB) is nothing, so what is left is the cost of
    issuing a kernel: the framework's dispatch, and on a GPU the launch."""
    import torch

    x = torch.randn(1, 64, device=info.kind)
    weight = torch.randn(64, 64, device=info.kind)
    call = lambda: torch.nn.functional.linear(x, weight)  # noqa: E731
    call()
    _sync(info)
    return _timer(info)(call, config)


def supported_dtypes(info: DeviceInfo) -> tuple[str, ...]:
    if info.kind == "cpu":
        return ("fp32", "bf16", "fp16")  # CPU fp8 is a software emulation (~60 MFLOP/s here)
    major, minor = map(int, info.details.get("compute_capability", "0.0").split("."))
    fp8 = ("fp8",) if (major, minor) >= (8, 9) else ()
    return ("fp16", "bf16", "fp32", *fp8, "int8")


def measure_ceilings(
    info: DeviceInfo,
    dtypes: tuple[str, ...] | None = None,
    log=print,
    config: TimerConfig = CEILING_TIMER,
    streams: bool = True,
) -> Ceilings:
    """`config`: the timer of every measurement (a smaller budget gives a quicker, noisier
    answer). `streams` False leaves the bandwidth out (its arrays, many times the last-level
    cache, take seconds to allocate on a CPU): `skipped` says so, and such ceilings are no
    device's roofline."""
    bandwidth, peaks, noise, skipped = {}, {}, {}, {}
    if not streams:
        skipped["bandwidth"] = "not measured (streams left out)"
    for name, (moved, timing) in (measure_bandwidth(info, config) if streams else {}).items():
        bandwidth[name] = moved / timing.median_s / 1e9
        noise[name] = timing.noise
        log(f"  {name:>6}: {bandwidth[name]:9.1f} GB/s  (noise {timing.noise:.1%})")
    for dtype in dtypes or supported_dtypes(info):
        try:
            flops, timing = measure_matmul_peak(info, dtype, config)
        except PerfkitError as exc:
            skipped[dtype] = str(exc)
            log(f"  {dtype:>6}: not measured ({exc})")
            continue
        peaks[dtype] = flops / timing.median_s / 1e12
        noise[dtype] = timing.noise
        log(
            f"  {dtype:>6}: {flops_text(peaks[dtype] * 1e12, 'OP/s' if dtype == 'int8' else 'FLOP/s'):>15} (noise "
            f"{timing.noise:.1%})"
        )
    overhead = measure_kernel_overhead(info, config)
    noise["kernel_overhead"] = overhead.noise
    log(f"  kernel: {overhead.median_s * 1e6:9.2f} us per call (noise {overhead.noise:.1%})")
    return Ceilings(
        info.key, bandwidth, peaks, noise, skipped, time.strftime("%Y-%m-%dT%H:%M:%S%z"), overhead.median_s * 1e6
    )
