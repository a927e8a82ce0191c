"""Studies built on simulation (search, SLOs, capacity planning, published cases).

A top-level package above ``sim``: ``sim`` never imports it (tests/test_import_graph.py).
"""
