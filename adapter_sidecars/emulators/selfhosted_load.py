"""The self-hosted model server's live load: warm/cold models and ``GET /v1/load``.

Our internal job API (provider-apis.md §3.4) has only ``GET /v1/health`` (status, queue depth,
workers); routing needs what an inference server's metrics endpoint gives (Triton's
``nv_inference_queue_duration``/``nv_gpu_utilization``/``nv_gpu_memory_*``, KServe's model
readiness), per model. So the job API has one more read, ``GET /v1/load`` (bearer auth like the
rest)::

    {"observed_at": "2026-12-01T20:00:00Z",
     "workers": {"total": 2, "busy": 1, "loading": 0},
     "vram": {"total_mb": 163840, "free_mb": 110592},
     "models": [{"model": "wan2.2-t2v", "state": "warm"|"loading"|"cold",
                 "queue_length": 3, "running": 1, "cold_start_s": 0.6,
                 "gpu_utilization": 0.5, "vram_total_mb": 163840, "vram_free_mb": 110592,
                 "available_slots": 1, "ready_replicas": 2}]}

What the numbers are, computed from the emulator's real state:

* the worker pool is shared by every model: ``available_slots`` = idle workers (total - busy -
  loading), ``gpu_utilization`` = (busy + loading) / total, the same for every model;
* a model is *warm* (resident on the pool: ``ready_replicas`` = total workers) once it was
  loaded (at start when ``preload``, else by its first job) until it has run no job for
  ``idle_unload_s`` (0: never unloaded); a job of a cold model first waits ``cold_start_s``
  (time mode, with every other job of that model that arrives meanwhile) while the model is
  *loading*; in polls mode a job's start loads its model at once;
* VRAM: ``gpu_vram_mb`` per worker; a resident model holds ``model_vram_mb``, a running job
  ``job_vram_mb`` more;
* seconds are wall seconds as a client sees them (simulated seconds x ``speed``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from adapter_sidecars.emulators.jobs import Job, Phase, iso

if TYPE_CHECKING:
    from adapter_sidecars.emulators.selfhosted import SelfHostedConfig


class ModelServer:
    """Which models are resident on the pool, and the load document built from it."""

    def __init__(self, config: SelfHostedConfig) -> None:
        self.config = config
        self._used: dict[str, float] = {}  # resident model -> when it last ran a job (wall)
        self._loading: dict[str, asyncio.Future[None]] = {}
        self.reset()

    def reset(self) -> None:
        now = time.time()
        self._used = {m: now for m in self.config.models} if self.config.preload else {}
        self._loading.clear()

    def _expire(self, now: float, running: Iterable[str]) -> None:
        idle = self.config.idle_unload_s * self.config.speed
        if self.config.idle_unload_s <= 0:
            return
        busy = set(running)
        for model, used in list(self._used.items()):
            if model not in busy and now - used >= idle:
                del self._used[model]

    def warm(self, model: str, running: Iterable[str] = ()) -> bool:
        self._expire(time.time(), running)
        return model in self._used

    def touch(self, job: Job) -> None:
        """A job of the model started or ended: the model is resident and was just used."""
        if job.phase is Phase.RUNNING or (
            job.phase.terminal and job.data.get("model") in self._used
        ):
            self._used[str(job.data["model"])] = time.time()

    async def ensure_loaded(self, model: str, running: Iterable[str]) -> None:
        """Time mode: wait for the model to be resident, loading it when cold (one load per
        model however many workers wait for it)."""
        if self.warm(model, running):
            return
        pending = self._loading.get(model)
        if pending is None:
            pending = self._loading[model] = asyncio.ensure_future(self._load(model))
        await asyncio.shield(pending)

    async def _load(self, model: str) -> None:
        try:
            await asyncio.sleep(self.config.cold_start_s * self.config.speed)
            self._used[model] = time.time()
        finally:
            self._loading.pop(model, None)

    def document(self, jobs: Iterable[Job]) -> dict[str, Any]:
        """The ``GET /v1/load`` body for the current jobs."""
        c = self.config
        now = time.time()
        queued: dict[str, int] = {}
        running: dict[str, int] = {}
        for j in jobs:
            model = str(j.data.get("model", ""))
            if j.phase is Phase.QUEUED:
                queued[model] = queued.get(model, 0) + 1
            elif j.phase is Phase.RUNNING:
                running[model] = running.get(model, 0) + 1
        self._expire(now, running)
        busy = sum(running.values())
        loading = min(len(self._loading), max(0, c.workers - busy))
        total_mb = c.workers * c.gpu_vram_mb
        used_mb = len(self._used) * c.model_vram_mb + busy * c.job_vram_mb
        free_mb = max(0, total_mb - used_mb)
        slots = max(0, c.workers - busy - loading)
        utilization = round(min(1.0, (busy + loading) / c.workers), 4) if c.workers else 0.0
        models = []
        for model in c.models:
            warm = model in self._used
            state = "warm" if warm else "loading" if model in self._loading else "cold"
            models.append(
                {
                    "model": model,
                    "state": state,
                    "queue_length": queued.get(model, 0),
                    "running": running.get(model, 0),
                    "cold_start_s": round(c.cold_start_s * c.speed, 6),
                    "gpu_utilization": utilization,
                    "vram_total_mb": total_mb,
                    "vram_free_mb": free_mb,
                    "available_slots": slots,
                    "ready_replicas": c.workers if warm else 0,
                }
            )
        return {
            "observed_at": iso(now),
            "workers": {"total": c.workers, "busy": busy, "loading": loading},
            "vram": {"total_mb": total_mb, "free_mb": free_mb},
            "models": models,
        }
