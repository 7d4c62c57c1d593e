"""The decision side of a run, without time: cache tiers, the decision protocol, workloads, copy-queue rules,
per-iteration records and accounting, the registries of pluggable parts."""
