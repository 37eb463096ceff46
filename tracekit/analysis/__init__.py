"""Cross-rank analyses: pure functions from tables to tables."""
