"""The Ray executor of a sweep: connecting, shipping code and traces, and one point as a task."""
