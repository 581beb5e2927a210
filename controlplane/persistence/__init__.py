"""Persistence for the control plane: PostgreSQL (asyncpg) and SQLite (aiosqlite), one code path.

The only room that speaks SQL (a test, ``tests/unit/test_sql_boundary.py``, fails the build if
another one does). `database.Database` owns the engine and opens the two ways in:

* **writes**: ``async with db.unit(now) as u:`` opens one transaction, a `unit.SqlUnitOfWork`,
  whose methods are every move a writer makes (``create_task``, ``move_task``, ``move_attempt``,
  ``create_attempt``, ``record_decision``, ``insert_job``, ``enqueue``, ``claim_messages``,
  ``complete_message``, ``publish``, ...), with the locked reads a writer decides from. The task
  compare-and-set + event + outbox step is written once, there.
* **named reads**: ``async with db.reads() as r:`` opens one read connection behind
  `reads.SqlReads`, whose methods are every read a service makes outside a unit (policy
  snapshots, documents, canary windows, balances, reconciliation runs, ...); no module above
  persistence holds a connection.
* **reads**: the query modules, read-only: `tasks` (a task with its history, pages, events),
  `catalog` (accounts, effective capabilities and prices, history, queued tasks, health events),
  `execution` (attempt snapshots, provider events, crashed submits), `exclusions` (failover
  history), `leases` (lease facts for the rebuild) and `snapshot` (the audit's one consistent
  read).

`ports` holds the Protocols the execution engine types against, and `memory.MemoryDatabase` is an
in-memory fake of them with the same compare-and-set semantics, for unit tests without a
database. Units and queries take and return domain types and the frozen views in `records`.
`models` declares every table of design 9.19, `migrations` creates them, `db` builds engines
with the per-backend settings, `advisory` holds the leader's PostgreSQL advisory lock session.
"""
