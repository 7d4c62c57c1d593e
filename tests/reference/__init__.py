"""Restated reference rules: plain, independent restatements of published algorithms and of the Diff-MoE
artifact's cache code, which tests compare the simulator's policies against decision for decision. Each is
written from the rule's description (or the artifact's source), not from the policy's code."""
