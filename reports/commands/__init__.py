"""The command floor: the code of the `python -m perfmodel.*` commands that run the decoder,
the profilers or the reports (roofline, speedup, plan, validate, search_benchmark). It sits
on the top layer, so the analytic core imports nothing above it: perfmodel's module of each
command's name only runs the code here by name (perfmodel.cli.console.COMMAND_CODE).
Nothing else imports these modules (the import contract in pyproject.toml)."""
