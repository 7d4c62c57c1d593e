"""The GPU validator: microbenchmarks, a torch executor of the shared policies, and sim-vs-real comparison."""
