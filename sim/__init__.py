"""The trace-driven SimPy simulator of offloaded MoE inference (see docs/architecture.md)."""
