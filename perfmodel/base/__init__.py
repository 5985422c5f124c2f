"""What every layer of the analytic core needs: the error type, dtypes, units, the toolkit's
paths and safe reading and writing of files. Imports nothing else of the toolkit."""
