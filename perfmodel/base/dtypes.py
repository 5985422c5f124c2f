"""Data types the toolkit models, and their element sizes."""

from perfmodel.base.errors import PerfkitError

# fp8 and int8 tensors are counted at one byte for every operand and the output; real
# fp8/int8 kernels often write a wider output, which this convention ignores.
ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1, "int8": 1}
DTYPES = tuple(ELEMENT_BYTES)


def element_bytes(dtype: str) -> int:
    return ELEMENT_BYTES[check_dtype(dtype)]


def check_dtype(dtype: str) -> str:
    if dtype not in ELEMENT_BYTES:
        raise PerfkitError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    return dtype


def default_dtype(device) -> str:
    """The dtype every command uses when none is given: fp16 on a GPU, where LLMs are served
    in half precision; fp32 on a CPU, where fp16 GEMM is a slow path (a model priced in fp16
    there never gains from a tree). device: a torch device kind ("cpu", "cuda"), a device
    name or key ("cpu", "cpu-<model>", "a100"), or a device view (its `is_cpu`)."""
    if hasattr(device, "is_cpu"):
        cpu = bool(device.is_cpu)
    else:
        name = str(device).strip().lower()
        cpu = name == "cpu" or name.startswith(("cpu-", "cpu_", "cpu:"))
    return "fp32" if cpu else "fp16"
