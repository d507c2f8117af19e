"""`inferq bench serve`: load-test a running inferq the way `vllm bench serve` does.

Client side only (no torch): requests go through Redis with the producer SDK or
through the gateway over HTTP. The in-process engine benchmarks live in
gpuworker.bench.
"""
