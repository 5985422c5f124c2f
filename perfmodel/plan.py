"""`python -m perfmodel.plan`: the capacity plan on the command line (perfmodel.plan_command).

Only run, never imported: the name perfmodel.plan is the planner function
(`from perfmodel import plan`), and importing a module of that name would rebind it to the
module. Its code is in perfmodel.plan_command.
"""

if __name__ != "__main__":
    raise ImportError(
        "perfmodel.plan is the planner function (from perfmodel import plan) and the command "
        "python -m perfmodel.plan; the command's code is perfmodel.plan_command"
    )

import sys

from perfmodel.cli import run
from perfmodel.plan_command import main

sys.exit(run(main))
