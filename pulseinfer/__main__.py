from pulseinfer.cli import entry

entry()
