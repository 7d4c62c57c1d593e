"""The base package: what the simulator (``sim``) and the trace tools (``traces``) both stand on, importing
neither: the errors that mean bad input, reading and writing files safely, the checks a config field goes through,
the registries of named parts, and model profiles."""
