"""Studies built on simulation (search, SLOs, capacity planning, published cases).

The simulator core never imports this layer.
"""
