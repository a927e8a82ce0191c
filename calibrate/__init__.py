"""Microbenchmarks over ``engine`` that fit a profile YAML for ``sim``. Not built yet: see the
calibration issue."""
