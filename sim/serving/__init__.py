"""The serving layer of one replica: requests, the KV pool, the scheduler loop, sessions and routers."""
