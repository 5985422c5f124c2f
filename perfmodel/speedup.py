"""`python -m perfmodel.speedup`: Medusa speedup and the best tree size per device (the paper's simulations).

The command's code is reports.commands.speedup, on the floor above the analytic core (it
draws with reports and can trace the decoder's step): this module only runs it by name
(perfmodel.cli.console.COMMAND_CODE), so the core imports nothing above it. Importing it
does nothing.
"""

from perfmodel.cli.console import run_command_code

if __name__ == "__main__":
    run_command_code(__spec__.name)
