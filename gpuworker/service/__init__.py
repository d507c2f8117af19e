"""The Redis Streams worker service: intake → engine thread → publisher,
with leases, a reaper, a dead-letter stream and graceful drain.

Threads and what they own:
  intake      XREADGROUP (own pending first, then new) up to free capacity;
              validates and tokenizes; hands jobs to the engine thread.
  engine      the only thread touching the engine: add / abort / step.
  publisher   one Redis pipeline per engine step (or a few, when it lags):
              reply events, done + XACK + XDEL, and the per-step cancel check.
  lease       heartbeat, lease refresh (XCLAIM JUSTID), reaper (XAUTOCLAIM),
              queue gauges.
"""
