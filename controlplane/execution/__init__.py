"""Task execution: what happens to an attempt between the scheduler's decision and delivery."""
