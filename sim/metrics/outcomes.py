"""A request's outcome names: why a request ended unfinished, as serving sets ``Request.unfinished_reason`` and the
tables and report read it.

Serving makes the outcomes (sim/serving/fleet.py cuts a run at the horizon or when it is stuck; admission's
``never_fits`` rejects a request that can never run) and records them here, in metrics (sim/metrics/tables.py
counts them, pulseinfer/report.py words them); metrics sits below serving (docs/design.md §3), so the names live
here and serving imports them.
"""

from __future__ import annotations

HORIZON, STUCK = "horizon", "stuck"  # why a cut run left a request unfinished
INCOMPLETE_REASONS = (HORIZON, STUCK)  # any other unfinished_reason is a rejection (the request can never run)
