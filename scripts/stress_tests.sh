#!/usr/bin/env bash
# Run one test (any pytest node id or path) N times beside a CPU hog, then print pass/fail counts.
#
#   scripts/stress_tests.sh tests/e2e/test_redis_loss.py 20
#   HOG=4 PYTEST_ARGS="-p no:randomly" scripts/stress_tests.sh tests/contract -k Recovery 8
#   make stress TEST=tests/e2e/test_redis_loss.py N=20 [HOG=2]
#
# A CI machine is often at load 15-40; a test that only passes on an idle machine is flaky, not
# green. The hog is one busy Python spinner per core (HOG overrides the count; HOG=0 runs
# without one), niced to 0 like the tests, started before the first run and killed on any exit
# (trap), so nothing outlives the script. Each run's output goes to OUT/run-<i>.log; the summary
# names the failed runs and the load average seen during the runs.
set -u

usage() { echo "usage: $0 TEST [N] [-- extra pytest args]" >&2; exit 2; }
[ $# -ge 1 ] || usage
TEST=$1; shift
N=${1:-20}; [ $# -ge 1 ] && shift
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
HOG=${HOG:-$(nproc)}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/stress.XXXXXX")}
mkdir -p "$OUT"

hog_pids=()
run_pid=
stop_hog() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null; done
  hog_pids=()
}
stop_run() {  # the run in progress and what it started (its own process group)
  [ -n "$run_pid" ] && kill -- "-$run_pid" 2>/dev/null
  run_pid=
}
trap stop_hog EXIT
trap 'stop_run; stop_hog; exit 130' INT TERM

for ((h = 0; h < HOG; h++)); do
  "$PY" -c 'while True: pass' &
  hog_pids+=("$!")
done

pass=0; fail=0; failed=(); max_load=0
cd "$ROOT"
for ((i = 1; i <= N; i++)); do
  start=$(date +%s)
  # Its own process group (setsid), so that stopping the script stops the run's children too.
  # shellcheck disable=SC2086 # PYTEST_ARGS is a word list on purpose
  setsid "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} "$TEST" "${EXTRA[@]}" \
    >"$OUT/run-$i.log" 2>&1 &
  run_pid=$!
  wait "$run_pid"
  rc=$?
  run_pid=
  load=$(cut -d' ' -f1 /proc/loadavg)
  max_load=$(awk -v a="$max_load" -v b="$load" 'BEGIN { print (b > a) ? b : a }')
  if [ "$rc" -eq 0 ]; then pass=$((pass + 1)); verdict=pass
  else fail=$((fail + 1)); failed+=("$i"); verdict="FAIL (rc $rc)"; fi
  echo "run $i/$N: $verdict in $(( $(date +%s) - start )) s, load $load"
done
stop_hog

echo "STRESS $TEST: runs=$N passed=$pass failed=$fail hog=$HOG max_load=$max_load logs=$OUT"
[ "$fail" -eq 0 ] || { echo "failed runs: ${failed[*]}"; exit 1; }
