"""The sample compile of a capability release against the live sidecars (design 9.25.5).

Each entry of a release is compiled the way routing will compile it once the release serves:
as the routed entry (CompileRequest.capability), on every sample of `capabilities.samples`,
through the same batch path as a dispatch round (`gather.compile_many`: one deadline, the
calls concurrent) but with a cache of its own, so a check never answers from, or fills, the
dispatcher's verdicts, in batches of a dispatch round's size, each under the round's compile
deadline. A sidecar that gives no answer is no verdict on the document: the
check raises `Unavailable` rather than blame the entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.capabilities.samples import sample_specs
from controlplane.domain.routing.candidates import Candidate, CompileResult
from controlplane.scheduling.gather import CompileCache, CompileJob, compile_many
from vidroute_core.capabilities.loader import Capability
from vidroute_core.exceptions import Unavailable
from vidroute_core.hashing import normalized_spec_hash

SHOWN_FAILURES = 3
BATCH = 16  # compiles in flight at once: a release's hundreds never swamp a sidecar


def _why(result: CompileResult) -> str:
    if result.error:
        return result.error
    rejects = [f"{f}: {d}" for f, kind, d in result.transformations if kind.value == "REJECT"]
    return "; ".join(rejects) or "not submittable"


class SampleCompiler:
    """Compiles releases' samples on the adapters a scheduling replica talks to."""

    def __init__(self, adapters: Mapping[str, AdapterClient], *, timeout_s: float) -> None:
        self._adapters, self._timeout_s = adapters, timeout_s

    async def __call__(self, caps: Sequence[Capability]) -> list[list[str]]:
        """Per entry, in order: its failed samples as ``<sample>: <why>`` (the first few and a
        count), empty when every sample compiles submittable."""
        jobs: list[CompileJob] = []
        owners: list[tuple[int, str, str]] = []
        for i, cap in enumerate(caps):
            # account_id 0: not stored yet, the check runs before the release is written
            candidate = Candidate.from_capability(cap, 0)
            for sample in sample_specs(cap):
                jobs.append((sample.spec, normalized_spec_hash(sample.spec), [candidate]))
                owners.append((i, sample.label, candidate.id))
        answers = []
        for start in range(0, len(jobs), BATCH):  # a round's deadline per round-sized batch
            answers += await compile_many(
                self._adapters,
                jobs[start : start + BATCH],
                CompileCache(),
                timeout_s=self._timeout_s,
            )
        failed: list[list[str]] = [[] for _ in caps]
        for (i, label, cid), (verdicts, _) in zip(owners, answers, strict=True):
            result = verdicts[cid]
            if result.transient:
                raise Unavailable(f"the sample compile of {cid} ({label}): {result.error}")
            if not result.submittable:
                failed[i].append(f"{label}: {_why(result)}")
        return [
            f[:SHOWN_FAILURES] + ([f"... {len(f) - SHOWN_FAILURES} more"] if len(f) > 3 else [])
            for f in failed
        ]
