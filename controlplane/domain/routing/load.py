"""Self-hosted model-server load in routing terms (design 9.21): pure, no I/O, no clock.

A provider that reports load (GetLoad: a self-hosted model server) gives, per model, its queue,
warm/cold state, GPU utilisation and free slots. Once per dispatch round the scheduler turns each
candidate's report into a `LoadView` (`load_view`): everything the score needs precomputed, so
the per-task decision only looks it up. The score (`selection`) then uses it three ways:

* **latency**: the predicted latency is the candidate's window mean latency plus ``extra_s`` =
  the cold start when the model is not warm, plus the queue wait: ``queue_length`` x the mean
  generation time (the window mean, else ``default_generation_s``) / the ready replicas
  (at least 1) serving the queue. Without a window mean the component starts from the neutral
  0.5 and loses ``extra_s`` / (bad - good);
* **capacity**: ``free`` = (available_slots / (available_slots + queue_length)) squared, the
  lease view's shape (0 when nothing is free and nothing queued: every slot busy), and the
  capacity component is the smaller of the lease view's and this;
* **penalty** ``GPU_UTILIZATION``: above ``busy_utilization`` the score loses up to
  ``max_penalty``, linearly to full utilisation (a saturated GPU slows every job on it).

A report is a hint, not a hard filter: a saturated server still queues the job (its own queue
limit answers QUEUE_FULL at submit, which the execution side already handles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vidroute_core.adapter import ModelLoad

PENALTY = "GPU_UTILIZATION"


@dataclass(frozen=True, slots=True)
class LoadScoring:
    """How load moves a score; the defaults are the shipped policy."""

    busy_utilization: float = 0.85
    max_penalty: float = 0.1
    default_generation_s: float = 60.0


@dataclass(frozen=True, slots=True)
class LoadView:
    """One candidate's reported load and what the score takes from it."""

    queue_length: int
    warm: bool
    cold_start_s: float
    gpu_utilization: float
    available_slots: int
    ready_replicas: int
    vram_free_mb: int
    vram_total_mb: int
    extra_s: float  # predicted seconds on top of the window mean: cold start + queue wait
    free: float  # capacity component from slots and queue, 0..1
    penalty: float  # GPU utilisation penalty, >= 0

    def to_json(self) -> dict[str, Any]:
        """The explain view (``facts.load`` of a stored decision)."""
        return {
            "queue_length": self.queue_length,
            "warm": self.warm,
            "cold_start_s": round(self.cold_start_s, 6),
            "gpu_utilization": round(self.gpu_utilization, 6),
            "available_slots": self.available_slots,
            "ready_replicas": self.ready_replicas,
            "vram_free_mb": self.vram_free_mb,
            "vram_total_mb": self.vram_total_mb,
            "predicted_extra_s": round(self.extra_s, 6),
            "capacity": round(self.free, 6),
            "penalty": round(self.penalty, 6),
        }


def load_view(
    load: ModelLoad, mean_generation_s: float | None, cfg: LoadScoring | None = None
) -> LoadView:
    """`load` in scoring terms, given the candidate's window mean latency (None: unknown)."""
    cfg = cfg or LoadScoring()
    generation = mean_generation_s if mean_generation_s is not None else cfg.default_generation_s
    queue, slots = max(0, load.queue_length), max(0, load.available_slots)
    cold = 0.0 if load.warm else max(0.0, load.cold_start_s)
    extra = cold + queue * max(0.0, generation) / max(1, load.ready_replicas)
    free = (slots / (slots + queue)) ** 2 if slots + queue > 0 else 0.0
    util = min(1.0, max(0.0, load.gpu_utilization))
    span = 1.0 - cfg.busy_utilization
    over = (util - cfg.busy_utilization) / span if span > 0 else float(util >= 1.0)
    penalty = cfg.max_penalty * over if over > 0 else 0.0
    return LoadView(
        queue_length=queue,
        warm=load.warm,
        cold_start_s=load.cold_start_s,
        gpu_utilization=util,
        available_slots=slots,
        ready_replicas=load.ready_replicas,
        vram_free_mb=load.vram_free_mb,
        vram_total_mb=load.vram_total_mb,
        extra_s=extra,
        free=free,
        penalty=penalty,
    )
