"""One module per ``pulseinfer`` sub-command: ``add_parser(subparsers)`` and ``run(args) -> int``."""
