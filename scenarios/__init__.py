"""Data only: shipped scenarios (``*.yaml``), model cards (``models/``) and hardware cards (``hardware/``).

This package holds no code; it exists so the YAML files install with the distribution and can be found
with ``importlib.resources.files("scenarios")``.
"""
