"""Time: the SimPy engine, its streams and copy engine, the clock over SimPy's public API, the costs of copies and
compute, and the timeline sink."""
