"""The capability matrix as data: versioned YAML entries, their schema and constraint language.

Shared by the scheduler (hard filtering, design 9.6) and the adapter sidecars (Describe, Compile).
"""
