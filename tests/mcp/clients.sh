#!/usr/bin/env bash
# Install the real agent clients the end-to-end MCP tests run (tests/mcp/test_mcp_clients.py), at
# pinned versions, from npm, under build/clients/ (gitignored; reused while the versions stay the
# same). Both ship native binaries: Node and npm are needed only to install them (scripts/setup.sh
# installs Debian's nodejs and npm when npm is missing). Behaviour changes between minor releases of
# these clients (see docs/mcp.md): move a pin only together with the tests.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${HSC_DIR:-$(cd "$HERE/../.." && pwd)/build/clients}
CODEX=@openai/codex@0.171.0
CLAUDE=@anthropic-ai/claude-code@2.1.332
stamp="$OUT/ready-$(echo "$CODEX $CLAUDE" | sha1sum | cut -c1-12)"
[ -e "$stamp" ] && exit 0
command -v npm >/dev/null 2>&1 || { echo "clients: npm is missing (scripts/setup.sh test installs it)" >&2; exit 1; }
echo "clients: installing $CODEX $CLAUDE into $OUT" >&2
rm -rf "$OUT/tmp" && mkdir -p "$OUT/tmp"
npm install --prefix "$OUT/tmp" --no-audit --no-fund --no-save --loglevel=error "$CODEX" "$CLAUDE" >&2
"$OUT/tmp/node_modules/.bin/codex" --version >/dev/null
"$OUT/tmp/node_modules/.bin/claude" --version >/dev/null
rm -rf "$OUT/node_modules" "$OUT"/ready-*
mv "$OUT/tmp/node_modules" "$OUT/node_modules" && rm -rf "$OUT/tmp"
touch "$stamp"
