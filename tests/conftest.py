"""Suite-wide test settings.

Hypothesis's default per-example deadline (200 ms) reads the wall clock: on a shared CI machine a slow example
fails the test whatever its result. No test here asserts on time, so the deadline is off for every property test.
"""

from hypothesis import settings

settings.register_profile("pulseinfer", deadline=None)
settings.load_profile("pulseinfer")
