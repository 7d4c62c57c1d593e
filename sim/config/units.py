"""Byte units. Hardware figures (memory, bandwidth) are decimal: ``GB`` = 10**9 bytes, as GPU and link vendors
state them. ``GIB`` = 2**30 bytes is for what is binary by nature: host memory as the OS reports it, allocation
sizes on a machine."""

GB = 1e9
GIB = 1 << 30

__all__ = ["GB", "GIB"]
