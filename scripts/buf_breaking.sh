#!/usr/bin/env bash
# `buf breaking` of the working proto/ against earlier contracts (make buf-breaking, make lint).
#
# "The previous main" is read from history, so a clean clone of main can check itself: the
# baselines are the proto/ trees of the last BUF_BREAKING_DEPTH (default 10) commits that
# changed proto/, HEAD included. Checking every one of them, not only HEAD~1, catches a break
# that a merged branch made in one commit and the merge's last commit does not show.
# Each baseline is taken with `git archive` into a directory (buf's own `.git#ref=` input clones
# the repository and fails inside a git worktree). A shallow clone cannot see the baselines and
# is refused rather than passed.
set -euo pipefail
cd "$(dirname "$0")/.."
depth="${BUF_BREAKING_DEPTH:-10}"
BUF="${BUF:-npx --no-install buf}"

if ! git rev-parse --git-dir >/dev/null 2>&1; then
  echo "buf-breaking: not a git clone, so there is no earlier proto/ to compare with" >&2
  exit 2
fi
if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  echo "buf-breaking: this clone is shallow; the earlier proto/ trees are missing." >&2
  echo "  fix: git fetch --unshallow" >&2
  exit 2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
seen=" "
checked=0
failed=0
for commit in $(git log -n "$depth" --format=%H HEAD -- proto); do
  tree="$(git rev-parse "$commit:proto" 2>/dev/null || true)"
  [ -n "$tree" ] || continue # the commit deleted proto/ as a whole
  case "$seen" in *" $tree "*) continue ;; esac
  seen="$seen$tree "
  dir="$tmp/$commit"
  mkdir -p "$dir"
  git archive "$commit" proto | tar -x -C "$dir"
  cp buf.yaml "$dir/"
  checked=$((checked + 1))
  if ! out="$($BUF breaking --against "$dir" 2>&1)"; then
    failed=$((failed + 1))
    echo "buf-breaking: proto/ breaks the contract of $(git log -1 --format='%h (%ad) %s' --date=short "$commit" | cut -c1-100)" >&2
    echo "$out" | sed 's/^/  /' >&2
  fi
done

if [ "$failed" -gt 0 ]; then
  cat >&2 <<'EOF'
buf-breaking: FAILED. Clients and sidecars already built against those contracts would break.
  Keep what exists (deprecate a field or RPC with `[deprecated = true]` / `option deprecated`,
  reserve a removed field's number and name), or put the incompatible contract in a new
  package version (vidroute.<area>.v2). Rules: buf.yaml `breaking` (FILE).
EOF
  exit 1
fi
echo "buf-breaking: proto/ is compatible with $checked earlier contract(s) (last $depth commits that changed proto/)"
