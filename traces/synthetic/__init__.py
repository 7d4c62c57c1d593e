"""Synthetic routing: the generator (`python -m traces synth`), its fit to a real trace, and the reshape of fitted
knobs to another model."""
