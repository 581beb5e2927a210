"""The GetLoad contract (design 9.21) bound to runway, veo and selfhosted like the rest of the
suite (`adapter_sidecars.contract.bound.TestLoad`; this directory's conftest parametrizes it)."""

from adapter_sidecars.contract.bound import TestLoad

__all__ = ["TestLoad"]
