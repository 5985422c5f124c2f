"""`python -m perfmodel.roofline`: the paper's Appendix G rooflines for a device and models.

The command's code is reports.commands.roofline, on the floor above the analytic core (it
draws with reports and can measure the ceilings with the profilers): this module only runs
it by name (perfmodel.cli.console.COMMAND_CODE), so the core imports nothing above it.
Importing it does nothing.
"""

from perfmodel.cli.console import run_command_code

if __name__ == "__main__":
    run_command_code(__spec__.name)
