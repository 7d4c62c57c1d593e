"""The decision side of a run, above the state it drives: the decision protocol an engine talks to (a policy and a
predictor stepped through each layer of each iteration), building a run's decisions from its config, and replaying
them without time. No SimPy or torch here: the simulator's engine and the GPU validator share it."""
