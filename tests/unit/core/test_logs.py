"""The kernel's logging: JSON lines with the bound id chain, redaction on every logger."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from vidroute_core.logs import (
    MAX_ARG_CHARS,
    RedactingFilter,
    TextFormatter,
    add_ids,
    bind_ids,
    bound_ids,
    configure_logging,
    ids_of,
    redact,
)

SIGNED = "https://storage.example/out/7.mp4?_jwt=eyJhbGciOiJIUzI1NiJ9.eyJqIjoiNyJ9.c2lnbmF0dXJl&x=1"
GOOG = (
    "https://storage.googleapis.com/b/o.mp4?X-Goog-Algorithm=GOOG4-RSA-SHA256"
    "&X-Goog-Credential=sa%40p.iam&X-Goog-Signature=0123456789abcdef"
)


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """The root logger configured in JSON on a buffer; restored afterwards."""
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    out = io.StringIO()
    configure_logging("DEBUG", "json", out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


# Loggers the tests here write to. A library thread left over from an earlier test in the same
# process may write to the root handler at any time, at DEBUG (aiosqlite's worker; grpc's
# "Loaded running loop" when a leftover aio object wakes); the tests write libraries' loggers
# at INFO and above only, so their DEBUG lines are not the test's.
_OURS = ("vidroute", "httpx", "grpc", "uvicorn")


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [
        line
        for line in lines
        if str(line.get("logger", "")).startswith(_OURS)
        and (str(line.get("logger", "")).startswith("vidroute") or line.get("level") != "DEBUG")
    ]


def test_redact_removes_url_queries_tokens_and_keys() -> None:
    text = redact(
        f"GET {SIGNED} then {GOOG}; headers {{'Authorization': 'Bearer sk-live-abcdef123456'}}"
        " x-api-key: key_9f8e7d6c5b and api_key=hunter22hunter"
    )
    for secret in ("eyJhbGci", "_jwt=", "X-Goog-Signature=", "0123456789abcdef", "sk-live"):
        assert secret not in text, text
    assert "key_9f8e7d6c5b" not in text, text
    assert "hunter22hunter" not in text, text
    assert "https://storage.example/out/7.mp4?<redacted>" in text
    assert redact("no secrets: attempt 7 SUCCEEDED") == "no secrets: attempt 7 SUCCEEDED"


def test_json_lines_carry_the_bound_ids(captured: io.StringIO) -> None:
    log = logging.getLogger("vidroute.test")
    with bind_ids(task_id=12, attempt_id=None):
        log.info("dispatching")
        with bind_ids(attempt_id=34):
            add_ids(client_request_key="12-1-abc", provider_job_id="job-9")
            log.info("attempt %s submitted", 34)
        log.info("back to the task")
    log.info("unbound")
    first, inner, back, unbound = _lines(captured)
    assert first["task_id"] == 12
    assert "attempt_id" not in first
    assert inner["msg"] == "attempt 34 submitted"
    assert (inner["task_id"], inner["attempt_id"]) == (12, 34)
    assert (inner["client_request_key"], inner["provider_job_id"]) == ("12-1-abc", "job-9")
    assert "attempt_id" not in back
    assert "client_request_key" not in back
    assert "task_id" not in unbound
    assert {"ts", "level", "logger", "msg"} <= set(unbound)
    assert unbound["level"] == "INFO"
    assert unbound["logger"] == "vidroute.test"


def test_ids_do_not_leak_between_concurrent_tasks(captured: io.StringIO) -> None:
    log = logging.getLogger("vidroute.test")

    async def one(task_id: int) -> None:
        with bind_ids(task_id=task_id):
            await asyncio.sleep(0)
            log.info("task %s", task_id)

    async def both() -> None:
        await asyncio.gather(one(1), one(2))

    asyncio.run(both())
    ours = [line for line in _lines(captured) if line["logger"] == "vidroute.test"]
    assert sorted(line["task_id"] for line in ours) == [1, 2]  # type: ignore[type-var]  # the log lines are JSON objects; task_id is an int
    assert all(line["msg"] == f"task {line['task_id']}" for line in ours)
    assert bound_ids() == {}


def test_third_party_loggers_are_redacted_and_long_prompts_cut(captured: io.StringIO) -> None:
    prompt = "a red kite over a green hill " * 40
    logging.getLogger("httpx").info('HTTP Request: GET %s "HTTP/1.1 200 OK"', SIGNED)
    logging.getLogger("grpc._cython").warning("metadata %r", {"authorization": "Bearer tok123456"})
    logging.getLogger("vidroute.test").info("compiled prompt %s", prompt)
    try:
        raise ValueError(f"fetch failed for {GOOG}")
    except ValueError:
        logging.getLogger("uvicorn.error").exception("boom")
    text = captured.getvalue()
    for secret in ("_jwt=", "eyJhbGci", "X-Goog-Signature=", "tok123456"):
        assert secret not in text, text
    httpx_line, grpc_line, prompt_line, error_line = _lines(captured)
    assert "<redacted>" in str(grpc_line["msg"])
    assert httpx_line["msg"] == (
        'HTTP Request: GET https://storage.example/out/7.mp4?<redacted> "HTTP/1.1 200 OK"'
    )
    assert len(str(prompt_line["msg"])) < MAX_ARG_CHARS + 64
    assert f"(+{len(prompt) - MAX_ARG_CHARS} chars)" in str(prompt_line["msg"])
    assert "ValueError" in str(error_line["exc"])
    assert "<redacted>" in str(error_line["exc"])


def test_a_bad_format_string_is_still_logged(captured: io.StringIO) -> None:
    logging.getLogger("vidroute.test").info("two %s %s", "args?")  # noqa: PLE1206 - on purpose
    [line] = _lines(captured)
    assert "two %s %s" in str(line["msg"])


def test_text_format_appends_the_ids() -> None:
    record = logging.LogRecord("vidroute.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    RedactingFilter().filter(record)
    with bind_ids(task_id=5, attempt_id=6):
        line = TextFormatter().format(record)
    assert line.endswith("INFO vidroute.x: hello you [task_id=5 attempt_id=6]"), line


def test_configure_logging_replaces_only_its_own_handler() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        configure_logging("INFO", "text", io.StringIO())
        configure_logging("INFO", "json", io.StringIO())
        ours = [h for h in root.handlers if h not in before]
        assert len(ours) == 1
        with pytest.raises(ValueError, match="log format"):
            configure_logging("INFO", "yaml")
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)


@dataclass
class _Attempt:
    id: int
    task_id: int
    client_request_key: str
    route_decision_id: int | None


@dataclass
class _Job:
    provider_job_id: str
    provider_request_id: str | None


def test_ids_of_reads_the_chain_from_rows() -> None:
    ids = ids_of(_Attempt(7, 3, "3-1-ab", None), _Job("job-1", None))
    assert ids == {
        "attempt_id": 7,
        "task_id": 3,
        "client_request_key": "3-1-ab",
        "provider_job_id": "job-1",
    }
