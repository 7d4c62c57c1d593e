"""Helpers shared by the tests (not tests themselves): paths, small trace builders, the policy and predictor
drivers, engine run configs, the validator's tiny model. Independent restatements of the rules the policies are
checked against live in ``tests/reference/``; fixtures live in ``tests/conftest.py``."""
