"""What every command line of the toolkit shares: the parser and argument types (parser),
the options each declared once (options; how a step is priced in pricing_options, a
workload's in workload_options), and the `medusa-perfkit` dispatcher (console)."""

from perfmodel.cli.parser import (
    MAX_BATCH,
    MAX_COUNT,
    MAX_TOKENS,
    TP_HELP,
    Parser,
    batch_size,
    bounded_int,
    job_count,
    most_jobs,
    positive_int,
    positive_number,
    run,
    token_count,
    tp_degree,
)

__all__ = [
    "MAX_BATCH",
    "MAX_COUNT",
    "MAX_TOKENS",
    "TP_HELP",
    "Parser",
    "batch_size",
    "bounded_int",
    "job_count",
    "most_jobs",
    "positive_int",
    "positive_number",
    "run",
    "token_count",
    "tp_degree",
]
