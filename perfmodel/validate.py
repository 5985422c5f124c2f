"""`python -m perfmodel.validate`: predict the speedup, run the decoder and compare (the closed loop).

The command's code is reports.commands.validate, on the floor above the analytic core (it
runs the profilers' closed loop): this module only runs it by name
(perfmodel.cli.console.COMMAND_CODE), so the core imports nothing above it. Importing it
does nothing.
"""

from perfmodel.cli.console import run_command_code

if __name__ == "__main__":
    run_command_code(__spec__.name)
