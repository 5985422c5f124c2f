"""`python -m perfmodel.published_check`: published GPU measurements of speculative decoding
beside the toolkit's predictions of them.

The command's code is reports.commands.published_check, on the floor above the analytic core
(it traces the decoder's eager step for the rows whose harness ran eager): this module only
runs it by name (perfmodel.cli.console.COMMAND_CODE). Importing it does nothing.
"""

from perfmodel.cli.console import run_command_code

if __name__ == "__main__":
    run_command_code(__spec__.name)
