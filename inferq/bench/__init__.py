"""The one home of inferq's benchmarks: ``inferq bench <name>`` runs ``inferq.bench.<name>``.

Client-side benchmarks (``serve``) need only the producer SDK; the engine ones
(``offline``, ``modes``, ``step``, ...) import the worker side when they run.
"""
