"""Command-line front of PulseInfer (``pulseinfer`` console script). Sub-commands import their package
only when they run, so ``pulseinfer simulate`` never loads torch."""

__version__ = "0.1.0"
