"""The kinds of kernel a traced step launches (decoder.trace classes each operator into one)."""

KINDS = ("gemm", "attention", "elementwise", "reduction", "indexing", "copy", "host_sync")
# Kinds priced by the bytes they move (plus a launch)
MEMORY_KINDS = ("elementwise", "reduction", "indexing", "copy")
