"""`python -m perfmodel.plan`: the capacity plan on the command line.

Only run, never imported: the name perfmodel.plan is the planner function
(`from perfmodel import plan`), and importing a module of that name would rebind it to the
module. The command's code is reports.commands.plan, on the floor above the analytic core (it
can trace the decoder's step), run by name (perfmodel.cli.console.COMMAND_CODE).
"""

if __name__ != "__main__":
    raise ImportError(
        "perfmodel.plan is the planner function (from perfmodel import plan) and the command "
        "python -m perfmodel.plan; the command's code is reports.commands.plan"
    )

from perfmodel.cli.console import run_command_code

run_command_code("perfmodel.plan")
