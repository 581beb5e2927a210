"""Persistence for the control plane: PostgreSQL (asyncpg) and SQLite (aiosqlite), one code path.

The rest of the system talks to the database only through `repository.Store`, which takes and
returns domain types and the frozen views in `records`. `models` declares the tables of design
9.19, `migrations` creates them, and `db` builds engines with the per-backend settings.
"""
