"""Studies built on simulation (search, SLOs, capacity planning); the simulator core never imports this layer."""
