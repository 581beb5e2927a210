"""Scheduling: the leader-elected dispatcher, breakers and health, and their wiring."""
