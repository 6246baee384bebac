"""Loom's agentic-workflow benchmark harness (`loom bench`); see bench/README.md."""
