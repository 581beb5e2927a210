#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer before the tests run,
# and that chromium is installed. Starts (installs) whichever is missing. Under CI=true one that
# cannot be started is a failure; elsewhere the tests that need it are skipped with a reason.
set -u
fail=0

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

wait_for() {  # wait_for CHECK SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do "$1" && return 0; sleep 0.1; done
  return 1
}

if ! pg_up; then
  echo "PostgreSQL is down; starting it"
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  fi
  wait_for pg_up 20 || { echo "PostgreSQL could not be started"; fail=1; }
fi

if ! redis_up; then
  echo "Redis is down; starting it"
  if command -v redis-server >/dev/null; then
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
  fi
  wait_for redis_up 10 || { echo "Redis could not be started"; fail=1; }
fi

# Debian's chromium for the console's browser test (tests/e2e/test_console_browser.py, driven by
# playwright-core from package.json); without it that test is skipped, or fails under CI=true.
if ! [ -x /usr/bin/chromium ]; then
  echo "chromium is missing; installing it (apt-get install chromium)"
  as_root=""
  [ "$(id -u)" -eq 0 ] || as_root="sudo -n"
  if command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -q chromium >/dev/null \
      || { DEBIAN_FRONTEND=noninteractive $as_root apt-get update -q >/dev/null \
        && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -q chromium >/dev/null; } \
      || true
  fi
  [ -x /usr/bin/chromium ] || { echo "chromium could not be installed"; fail=1; }
fi

if [ "$fail" -ne 0 ] && [ "${CI:-}" = "true" ]; then
  echo "required services are missing under CI=true" >&2
  exit 1
fi
exit 0
