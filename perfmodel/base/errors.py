"""The one exception type the toolkit raises for bad input.

CLIs print its message as a single line and exit non-zero; a traceback means a bug.
"""


class PerfkitError(ValueError):
    """Bad input: unknown device/model/dtype, invalid spec file, impossible configuration."""
