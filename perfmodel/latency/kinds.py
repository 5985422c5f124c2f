"""The kinds of op a traced step holds (decoder.trace classes each operator into one).

Kernels (KINDS) run on the device. Host-only ops (HOST_ONLY_KINDS) are the host's work
alone: `view`, an operator dispatched from Python that launches no kernel (a view, a reshape,
an allocation), and `module`, the call of an nn.Module (its hooks and bookkeeping around its
forward). A step priced as its kernels' sum gives them no time; the host pipeline
(perfmodel.latency.pipeline) charges the host for each.
"""

KINDS = ("gemm", "attention", "elementwise", "reduction", "indexing", "copy", "host_sync")
# Kinds priced by the bytes they move (plus a launch)
MEMORY_KINDS = ("elementwise", "reduction", "indexing", "copy")
HOST_ONLY_KINDS = ("view", "module")
TRACE_KINDS = (*KINDS, *HOST_ONLY_KINDS)


def kernel_rows(trace):
    """A trace's kernels: its rows less the host-only ones."""
    return trace[trace["kind"].isin(KINDS)]
