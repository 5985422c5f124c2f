"""Self-contained HTML and PNG reports: the page builder, figures and parallel rendering."""
