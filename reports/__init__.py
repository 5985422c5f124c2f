"""Self-contained HTML and PNG reports: the page builder, figures and parallel rendering.

Reports write files and never open a window: the file-only Agg backend is selected here,
when the package is first imported, so before any reports module (reports.plotting, the one
that imports pyplot) can load pyplot, whatever order the modules are imported in.
"""

import matplotlib

matplotlib.use("Agg")
