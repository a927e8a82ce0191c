"""Measurement of the real engine: microbenchmarks fitted into a profile YAML the simulator reads
(``pulseinfer calibrate``), the one recall microbenchmark (also ``pulseinfer engine-bench``), validation of
the simulator against the engine (``pulseinfer validate``), and real-model accuracy and selection statistics
(``pulseinfer accuracy``, ``pulseinfer calibrate selection``); see README.md. Imports ``engine`` and ``sim``;
neither imports it."""
