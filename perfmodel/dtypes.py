"""Data types the toolkit models, and their element sizes."""

from perfmodel.errors import PerfkitError

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


def default_dtype(device_kind: str) -> str:
    """GPUs run LLMs in half precision; CPUs in fp32 (fp16 GEMM is a slow path on CPUs)."""
    return "fp32" if device_kind == "cpu" else "fp16"
