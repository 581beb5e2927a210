"""The control plane's rules, with no I/O: what may happen to a task, and why.

Every module here is pure: it imports the standard library, the kernel (`vidroute_core`) and
this package, nothing above it (`tests/unit/test_import_graph.py` enforces it). Persistence,
execution and scheduling load the facts, call these rules and apply what they decide.

- `states`: task and attempt lifecycles as transition tables, phases, the in-flight set;
- `observation`: judging one observation of a provider job (moves, late events, adoption);
- `failover`, `requeue`: what follows a definite failure, and the exclusions a requeue leaves;
- `breaker`, `fairqueue`, `polling`, `deadlines`, `safety`: circuit breakers, dispatch order,
  poll cadence, task and queue deadlines, the platform safety policy;
- `outbox`: the outbox topics, spelled once;
- `routing`: the routing pipeline (`candidates`, `filters`, `selection`, `decision`) and
  `scoring`, its utility functions.

Nothing is re-exported here: import from the module that holds the name.
"""
