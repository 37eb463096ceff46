"""Input-format parsers (installed as `tracekit.parsers`): one module per format, plus detection."""
