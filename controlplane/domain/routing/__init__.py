"""The routing pipeline of design 9.10: which candidates may run a task, which one does, and why.

Pure: no I/O, no clock. The dispatcher gathers the facts (catalog candidates, breaker states,
lease pre-checks, compile plans, health windows) and the pipeline turns them into one explainable
`decision.RouteDecisionSnapshot` (9.10.2). Four rooms, in the order a decision is made:

- `candidates`: the inputs of steps 1-2: a `Candidate` (provider account, region, model version,
  capability, `Price`), the adapter's `CompileResult`, the dynamic facts of decision time
  (`RoutingContext`: breakers, `CapacityView`, `HealthView`, failover exclusions, the incumbent)
  and the `catalog_version` a decision was made against;
- `filters`: the hard constraints of steps 3-7 (`hard_reject`, the dispatcher's `prefilter`
  before any adapter Compile call, the compile verdict) and the `Reason` codes of an ineligible
  candidate;
- `selection`: step 8 among the eligible only (9.13.1: no weight can resurrect a rejected
  candidate): scoring, hysteresis/dwell, consistent-hash bucketing of near-ties, canary admission
  and the shadow policy; `route` runs steps 3-8;
- `decision`: the record: each candidate's `Verdict`, the `Outcome` and the ranked fall-through
  order, as stored in ``route_decisions.candidate_snapshot``;
- `plan`: the static half, once per catalog version: candidates sorted by id with their fields
  read out, capabilities of equal content shared, constraint rules compiled
  (`vidroute_core.capabilities.compiled`). The dispatcher runs `filters.screen` once per task
  and hands it to `selection.route`, so no hard filter runs twice in a decision.

Steps 9-12 (lease, Attempt + RouteDecision + outbox, submit) belong to the dispatcher, which
calls `RouteDecisionSnapshot.after_leasing` to record which ranked candidates refused a lease.

Nothing is re-exported here: import from the room that holds the name.
"""
