"""`python -m perfmodel.search_benchmark`: time the README's serving search beside the import floor.

The command's code is reports.commands.search_benchmark, on the floor above the analytic
core (it times the plan command, whose code is there): this module only runs it by name
(perfmodel.cli.console.COMMAND_CODE), so the core imports nothing above it. Importing it
does nothing.
"""

from perfmodel.cli.console import run_command_code

if __name__ == "__main__":
    run_command_code(__spec__.name)
