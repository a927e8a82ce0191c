"""Per-step reference implementations (test oracles) of mechanisms sim/ defines once over a step axis."""
