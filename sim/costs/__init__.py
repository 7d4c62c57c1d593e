"""The cost model: what a copy, an expert's compute on the GPU or the host, a dense layer and a phase take on a
machine, and the throughput bound they imply; read by the engine, which owns time, and by the policies that weigh
costs. No SimPy here."""
