"""Recording routing from a Hugging Face MoE model on this machine (`python -m traces record`), and the tiny models
tests record from."""
