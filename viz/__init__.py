"""Figures and the standalone HTML report (installed as `tracekit.viz`)."""
