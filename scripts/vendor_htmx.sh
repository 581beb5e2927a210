#!/usr/bin/env bash
# Copy htmx from the npm package (package.json pins htmx.org exactly) into the console's static
# directory, with a version and licence header. The copy is committed, so `make up` and the
# wheels need no npm and the console needs no CDN; tests/unit/console checks it is current.
set -euo pipefail
cd "$(dirname "$0")/.."
src=node_modules/htmx.org
version=$(node -p "require('./$src/package.json').version")
{
  printf '/*! htmx.org %s | Zero-Clause BSD (0BSD) licence, https://github.com/bigskysoftware/htmx | vendored by scripts/vendor_htmx.sh */\n' "$version"
  cat "$src/dist/htmx.min.js"
} > controlplane/console/static/htmx.min.js
echo "controlplane/console/static/htmx.min.js <- htmx.org $version"
