"""Locality figures of a trace (`python -m traces stats`) and the step-wise LRU they use."""
