"""`vidroute` as a user drives it: the installed console script (``.venv/bin/vidroute``) as a
subprocess against a running platform (emulators, the three sidecars on their shipped configs,
a control plane on SQLite), configured the way the README says: ``VIDROUTE_TARGET`` and
``VIDROUTE_TOKEN`` instead of ``--target`` on every call.

One stack for the module. The five modes are submitted at once with ``--wait`` (each prints its
progress lines, the state timeline and the task); then explain, get, list, cancel and watch (a
task held by an operator's open breaker), download (bytes equal to the stored object), the
operator commands, feedback then quality, a bad spec (one line per field violation, exit 2)
and an unreachable server (one line naming the target, exit 1).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.module_stack import started_platform
from tests.support.stack import ControlPlane, free_port, local_path, wait_for
from vidroute.common.v1 import generation_pb2 as gen
from vidroute.scheduler.v1 import scheduler_pb2 as sp

# The module's first test also starts the platform and waits for the five submits.
pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(240)]

# Jobs take 60 s of production time at the providers: 3 s here.
TIME_SCALE = 0.05
VIDROUTE = Path(sys.executable).with_name("vidroute")
ASSETS = "https://assets.example.com"
# One submit per mode, each pinned to a model that serves it (video-to-video: none does).
MODES: dict[str, list[str]] = {
    "text-to-video": ["--provider", "runway", "--model", "gen4.5"],
    "image-to-video": [
        *("--provider", "runway", "--model", "gen4.5"),
        *("--first-frame", f"{ASSETS}/kite.png"),
    ],
    "first-last-to-video": [
        *("--provider", "runway", "--model", "veo3.1", "--duration", "8"),
        *("--first-frame", f"{ASSETS}/dawn.jpg", "--last-frame", f"{ASSETS}/dusk.png#image/png"),
    ],
    "video-to-video": ["--source-video", f"{ASSETS}/clip.mp4"],
    "extend-video": [
        *("--provider", "google", "--model", "veo-3.1-generate-preview", "--duration", "8"),
        *("--source-video", f"{ASSETS}/clip.mp4"),
    ],
}


@dataclass
class User:
    """A shell with VIDROUTE_TARGET and VIDROUTE_TOKEN exported, in its own directory."""

    cp: ControlPlane
    workdir: Path
    env: dict[str, str]

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(VIDROUTE), *args],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.finish(self.popen(*args), timeout)

    def finish(
        self, proc: subprocess.Popen[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Its output once it exits; killed (and the test failed with what it said) if not."""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(
                f"{proc.args!r} still running after {timeout} s:\n{out}\n{err}\n{self.cp.logs()}"
            )
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def json(self, *args: str) -> Any:
        done = self.run(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


@dataclass
class Submitted:
    done: subprocess.CompletedProcess[str]
    task: sp.Task


@pytest.fixture(scope="module")
def user(redis_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[User]:
    workdir = tmp_path_factory.mktemp("cli-user")
    url = f"sqlite+aiosqlite:///{workdir / 'vidroute.db'}"
    with started_platform(workdir, url, redis_server_url, time_scale=TIME_SCALE) as platform:
        _, cp, _ = platform
        assert cp.proc is not None
        home = workdir / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIDROUTE_")}
        env.update(
            VIDROUTE_TARGET=cp.proc.address,
            VIDROUTE_TOKEN=cp.token,
            # No config file under this home (a missing default is no error, a named one is):
            # the environment decides, never the user's own ~/.config.
            XDG_CONFIG_HOME=str(home),
        )
        yield User(cp, home, env)


# A spec file in the proto JSON shape (YAML), as a service would keep it; flags override it.
SPEC_FILE = f"""\
tenant_id: acme
prompt: from the file
mode: MODE_IMAGE_TO_VIDEO
first_frame: {{object_uri: "{ASSETS}/kite.webp", mime_type: image/webp}}
output: {{width: 1280, height: 720, duration_ms: 5000}}
routing:
  mode: ROUTING_MODE_STRICT_MODEL
  required_provider: self_hosted
  required_model: wan2.2-i2v
priority: 7
"""


@pytest.fixture(scope="module")
def submitted(user: User) -> dict[str, Submitted]:
    """Every mode submitted at once with --wait, each followed to its end, and one more from a
    YAML spec file with the prompt overridden by a flag."""
    procs = {
        mode: user.popen(
            "submit", "--tenant", "acme", "--prompt", f"a red kite, {mode}", "--mode", mode,
            "--wait", *flags,
        )
        for mode, flags in MODES.items()
    }  # fmt: skip
    spec_file = user.workdir / "kite.yaml"
    spec_file.write_text(SPEC_FILE, encoding="utf-8")
    procs["spec-file"] = user.popen(
        "submit", "--spec", str(spec_file), "--prompt", "from the flag", "--wait"
    )
    results = {}
    for mode, proc in procs.items():
        done = user.finish(proc, timeout=120)
        created = re.search(r"^task (\d+) created", done.stdout, re.MULTILINE)
        assert created, (mode, done.stdout, done.stderr)
        results[mode] = Submitted(done, user.cp.get_task(created.group(1)))
    return results


def test_every_mode_is_submitted_with_its_assets_and_waited_for(
    submitted: dict[str, Submitted],
) -> None:
    """Each --wait ends with the state timeline and the task: exit 0 and SUCCEEDED for the four
    modes a model serves, with the asset flags stored in the spec (MIME type from the extension
    or the URI's #fragment); video-to-video, which no model serves, exits 1 and prints why."""
    for mode, run in submitted.items():
        if mode not in MODES:
            continue
        out = run.done.stdout
        assert "timeline:" in out, (mode, out)
        assert re.search(r"^\s+\+\d+\.\ds\s+QUEUED$", out, re.MULTILINE), (mode, out)
        assert run.task.spec.mode == gen.Mode.Value("MODE_" + mode.upper().replace("-", "_"))
        if mode == "video-to-video":
            assert run.done.returncode == 1, (mode, out, run.done.stderr)
            assert run.task.state == sp.TASK_STATE_FAILED
            assert f"failed: {run.task.failure.code}: " in out, out
            assert "NO_ELIGIBLE_CANDIDATE" in out, out
            continue
        assert run.done.returncode == 0, (mode, out, run.done.stderr)
        assert run.task.state == sp.TASK_STATE_SUCCEEDED, (mode, out)
        assert re.search(r"^\s+\+\d+\.\ds\s+SUCCEEDED$", out, re.MULTILINE), (mode, out)
        assert f"task {run.task.task_id}  SUCCEEDED" in out
    spec = {mode: run.task.spec for mode, run in submitted.items()}
    first = spec["image-to-video"].first_frame
    assert (first.object_uri, first.mime_type) == (f"{ASSETS}/kite.png", "image/png")
    first_last = spec["first-last-to-video"]
    assert first_last.first_frame.mime_type == "image/jpeg"
    assert (first_last.last_frame.object_uri, first_last.last_frame.mime_type) == (
        f"{ASSETS}/dusk.png",
        "image/png",
    )
    assert spec["extend-video"].source_video.mime_type == "video/mp4"
    assert spec["video-to-video"].source_video.object_uri == f"{ASSETS}/clip.mp4"


def test_a_spec_file_is_submitted_with_flags_over_it(submitted: dict[str, Submitted]) -> None:
    """`submit --spec FILE --prompt P`: the file's fields (mode, asset, output, routing,
    priority) reach the task, the flag's prompt replaces the file's, and it runs to SUCCEEDED."""
    run = submitted["spec-file"]
    assert run.done.returncode == 0, (run.done.stdout, run.done.stderr)
    spec = run.task.spec
    assert spec.prompt == "from the flag"
    assert spec.mode == gen.MODE_IMAGE_TO_VIDEO
    assert (spec.first_frame.object_uri, spec.first_frame.mime_type) == (
        f"{ASSETS}/kite.webp",
        "image/webp",
    )
    assert (spec.output.duration_ms, spec.priority) == (5000, 7)
    assert run.task.attempts[-1].model == "wan2.2-i2v"
    assert run.task.state == sp.TASK_STATE_SUCCEEDED


def test_wait_prints_the_providers_progress(submitted: dict[str, Submitted]) -> None:
    """Runway reports a fraction while it generates: piped, --wait prints a line per progress
    event, rising, before the timeline."""
    out = submitted["text-to-video"].done.stdout
    fractions = [int(p) for p in re.findall(r"^progress (\d+)%", out, re.MULTILINE)]
    assert fractions, out
    assert fractions == sorted(fractions), out
    assert out.index("progress ") < out.index("timeline:")


def test_explain_get_and_list_show_the_tasks(user: User, submitted: dict[str, Submitted]) -> None:
    """explain shows the pinned candidate selected and the others rejected with the reason; get
    of the failed task prints its failure; list (filtered, --json and table) shows the tasks."""
    task = submitted["image-to-video"].task
    explained = user.run("explain", task.task_id)
    assert explained.returncode == 0, explained.stderr
    assert re.search(r"^runway/gen4\.5/\S+\s+yes\s+\d\.\d{3}\s", explained.stdout, re.MULTILINE)
    assert "STRICT_MODEL_MISMATCH" in explained.stdout
    decisions = user.json("explain", task.task_id)["decisions"]
    assert decisions[0]["selected_candidate"].startswith("runway/gen4.5/")

    failed = submitted["video-to-video"].task
    shown = user.run("get", failed.task_id)
    assert f"failed: {failed.failure.code}: {failed.failure.message[:40]}" in shown.stdout

    listed = user.json("list", "--tenant", "acme")
    ids = {t["task_id"] for t in listed["tasks"]}
    assert {run.task.task_id for run in submitted.values()} <= ids
    only_failed = user.json("list", "--tenant", "acme", "--state", "failed")["tasks"]
    assert [t["task_id"] for t in only_failed] == [failed.task_id]
    table = user.run("list", "--tenant", "acme", "--limit", "2")
    assert table.returncode == 0, table.stderr
    assert len(re.findall(r"^\s*\d+\s+[A-Z_]+\s+acme\s", table.stdout, re.MULTILINE)) == 2
    assert "raise --limit" in table.stdout


def test_cancel_a_held_task_and_watch_it_end(user: User) -> None:
    """An operator forces the self-hosted model's breaker OPEN (force-breaker; breakers shows it
    forced), so a task pinned to it stays QUEUED; cancel says it cancelled it; watch streams the
    events, one line each, to CANCELLED; a second cancel says the task had already finished."""
    account = next(p for p in user.json("providers")["providers"] if p["provider"] == "self_hosted")
    breaker = [
        *("self_hosted", "--account", account["account"], "--region", account["region"]),
        *("--model", "wan2.2-t2v"),
    ]
    forced = user.run("force-breaker", *breaker, "--state", "open", "--reason", "cli drill")
    assert forced.returncode == 0, forced.stderr
    try:
        shown = user.json("breakers", "--provider", "self_hosted")["breakers"]
        assert any(b.get("forced") and b["model"] == "wan2.2-t2v" for b in shown), shown
        created = user.json(
            "submit", "--tenant", "acme", "--prompt", "a held kite",
            "--provider", "self_hosted", "--model", "wan2.2-t2v",
        )  # fmt: skip
        task_id = created["task_id"]
        # The dispatcher's next round decides: the only candidate's breaker is open.
        wait_for(
            lambda: "CIRCUIT_OPEN" in user.run("explain", task_id).stdout,
            timeout_s=30,
            interval_s=0.2,
            what=f"task {task_id} explained as held by the open breaker",
        )
        assert user.cp.get_task(task_id).state == sp.TASK_STATE_QUEUED
        cancelled = user.run("cancel", task_id, "--reason", "changed my mind")
    finally:
        user.run("force-breaker", *breaker, "--state", "release", "--reason", "cli drill")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"task {task_id}: cancelled; now CANCELLED"), (
        cancelled.stdout
    )
    watched = user.run("watch", task_id)
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    assert re.search(r"\bCREATED\s+QUEUED$", lines[0]), lines
    assert re.search(r"\bTASK_STATE_CHANGED\s+CANCELLED$", lines[-1]), lines
    again = user.run("cancel", task_id)
    assert again.stdout.startswith(f"task {task_id}: already finished"), again.stdout
    assert user.cp.get_task(task_id).state == sp.TASK_STATE_CANCELLED


def test_download_writes_the_stored_bytes(user: User, submitted: dict[str, Submitted]) -> None:
    """download -o FILE writes exactly the stored object's bytes (GetOutput, checked); with
    --json it says what it wrote on stdout."""
    task = submitted["first-last-to-video"].task
    target = user.workdir / "kite.mp4"
    done = user.run("download", task.task_id, "-o", str(target), "--sample", "0")
    assert done.returncode == 0, done.stderr
    stored = local_path(task.output.uri).read_bytes()
    assert target.read_bytes() == stored
    assert f"{len(stored)} bytes" in done.stderr
    again = user.run("download", task.task_id, "-o", str(target), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {
        "path": str(target),
        "size_bytes": len(stored),
        "task_id": task.task_id,
        "sample_index": 0,
    }


def test_a_bad_spec_prints_one_line_per_field_violation(user: User) -> None:
    """The server's field violations come back one line each, exit code 2, no traceback; a
    value the proto cannot even carry is a usage error before any call, also exit 2."""
    done = user.run("submit", "--tenant", "acme", "--prompt", " ", "--width", "0", "--height", "3")
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    fields = [line.split(":")[1].strip() for line in lines]
    assert fields == ["prompt", "output.width", "output.height"], lines
    assert all(line.startswith("error: ") for line in lines)
    assert done.stdout == ""
    negative = user.run("submit", "--tenant", "acme", "--prompt", "kite", "--height", "-1")
    assert negative.returncode == 2
    assert len(negative.stderr.splitlines()) == 1, negative.stderr
    assert "--height" in negative.stderr
    assert "Traceback" not in negative.stderr + done.stderr


def test_an_unreachable_server_is_one_line_naming_the_target(user: User) -> None:
    """Nothing listens on the target: one line that names it, exit code 1, no traceback."""
    target = f"127.0.0.1:{free_port()}"
    done = user.run("get", "1", "--target", target)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot reach the control plane at {target} ")
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_operator_commands_show_the_platform(user: User) -> None:
    """providers prints the capability matrix (every provider's models with their versions),
    health reports SERVING (exit 0), and a capability document with a bad entry is refused with
    one line per violation (exit 2)."""
    matrix = user.run("providers")
    assert matrix.returncode == 0, matrix.stderr
    for provider, model in (("runway", "gen4.5"), ("google", "veo-3.1-generate-preview")):
        name = re.escape(model)
        row = rf"^{provider}\s+\S+\s+\S+\s+{name}\s+\S+\s+{provider}/{name}/"
        assert re.search(row, matrix.stdout, re.MULTILINE), matrix.stdout
    assert "self_hosted" in matrix.stdout
    health = user.run("health")
    assert health.returncode == 0, health.stdout + health.stderr
    assert re.search(r"^vidroute\.scheduler\.v1\.SchedulerService\s+SERVING$", health.stdout, re.M)
    bad = user.workdir / "bad-capabilities.yaml"
    bad.write_text("provider: runway\nmodel: gen9\n", encoding="utf-8")
    refused = user.run("capabilities", "publish", str(bad), "--dry-run")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: document"), refused.stderr
    assert "Traceback" not in refused.stderr


def test_feedback_then_quality_shows_it(user: User, submitted: dict[str, Submitted]) -> None:
    """feedback on a SUCCEEDED task records the verdict once (again: already recorded, exit 0),
    quality --model counts it in the model's whole-mode bucket (table and --json), a task that
    did not succeed is refused with the state (exit 1), and canaries answers."""
    task = submitted["text-to-video"].task
    model = task.attempts[-1].model
    done = user.run("feedback", task.task_id, "accepted", "--tag", "motion", "--comment", "ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"task {task.task_id}: accepted recorded"
    again = user.json("feedback", task.task_id, "ACCEPTED")
    assert again == {"task_id": task.task_id, "verdict": "ACCEPTED", "recorded": False}

    table = user.run("quality", "--model", model)
    assert table.returncode == 0, table.stderr
    rows = [line.split() for line in table.stdout.splitlines() if "(whole mode)" in line]
    row = next(r for r in rows if r[2] == "TEXT_TO_VIDEO")
    assert row[:2] == [task.attempts[-1].provider, model]
    assert row[5] == "1/0/0", table.stdout
    buckets = user.json("quality", "--model", model)["buckets"]
    whole = {b["mode"]: b.get("accepted", "0") for b in buckets if not b.get("bucket")}
    assert whole["TEXT_TO_VIDEO"] == "1", buckets
    assert {b["model"] for b in buckets} == {model}

    failed = submitted["video-to-video"].task
    refused = user.run("feedback", failed.task_id, "rejected")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: FAILED_PRECONDITION: "), refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    canaries = user.run("routing", "canaries")
    assert canaries.returncode == 0, canaries.stderr
