"""Importers: routing recorded by other tools brought into the one trace format (`python -m traces import FORMAT
...`)."""
