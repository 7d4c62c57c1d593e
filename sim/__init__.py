"""The trace-driven SimPy simulator of offloaded MoE inference (see ../shared/DESIGN.md section 3)."""
