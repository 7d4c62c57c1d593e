"""Run configs and the profiles they name (model, hardware, serving system), checked field by field into frozen
dataclasses, with the readers and checks they share."""
