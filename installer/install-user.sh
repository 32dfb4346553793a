#!/bin/sh
# Install an unpacked SAPO Swarm tarball for this user, without root (it ships in the tarball):
#
#   ./install-user.sh               copy this folder to ~/.local/share/sapo-swarm/app/versions/V,
#                                   point .../app/current at it, link sapo-swarm and sapo-node into
#                                   ~/.local/bin, add the menu entry with the sapo:// handler
#   ./install-user.sh --uninstall   remove all that again; your runs stay
#
# The layout is the one the app's updater installs new versions into (sapo_core/updates.py), so
# an install made this way updates itself; a folder run where it was unpacked does not.
# XDG_DATA_HOME and BIN_DIR (default ~/.local/bin) are respected.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd -P)
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
ROOT="$DATA/sapo-swarm/app"
BIN=${BIN_DIR:-$HOME/.local/bin}
ENTRY="$DATA/applications/sapo-swarm.desktop"
ICON="$DATA/icons/hicolor/scalable/apps/sapo-swarm.svg"

die() { printf 'install-user.sh: %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" = --uninstall ]; then
  for c in sapo-swarm sapo-node; do
    case $(readlink "$BIN/$c" 2>/dev/null || true) in "$ROOT"/*) rm -f "$BIN/$c" ;; esac
  done
  rm -f "$ENTRY" "$ICON"
  rm -rf "$ROOT"
  echo "Removed SAPO Swarm from $ROOT, its commands and menu entry; your runs in $DATA/sapo-swarm stay."
  exit 0
elif [ $# -gt 0 ]; then
  die "unknown option $1 (--uninstall, or nothing)"
fi

[ -x "$HERE/sapo-swarm" ] || die "$HERE has no sapo-swarm: run this from the unpacked tarball's folder"
VERSION=$("$HERE/sapo-swarm" -m sapo_core.cli --version | sed -n 's/^sapo-node \([0-9A-Za-z.+!-]*\)$/\1/p')
[ -n "$VERSION" ] || die "$HERE/sapo-swarm does not say its version"

mkdir -p "$ROOT/versions" "$BIN" "$(dirname "$ENTRY")" "$(dirname "$ICON")"
TARGET="$ROOT/versions/$VERSION"
if [ "$HERE" != "$TARGET" ]; then
  rm -rf "$TARGET.new"
  cp -a "$HERE" "$TARGET.new"
  rm -rf "$TARGET"
  mv "$TARGET.new" "$TARGET"
fi
ln -sfn "versions/$VERSION" "$ROOT/.current.new"
mv -T "$ROOT/.current.new" "$ROOT/current" # one rename, as the updater switches versions
for c in sapo-swarm sapo-node; do ln -sfn "$ROOT/current/$c" "$BIN/$c"; done
cp "$TARGET/sapo-swarm.svg" "$ICON"
grep -v '^#' "$TARGET/sapo-swarm.desktop" | sed -e "s|@EXEC@|$ROOT/current/sapo-swarm|" -e "s|@ICON@|$ICON|" >"$ENTRY"
if command -v update-desktop-database >/dev/null 2>&1; then update-desktop-database "$(dirname "$ENTRY")" >/dev/null 2>&1 || true; fi
if command -v xdg-mime >/dev/null 2>&1; then xdg-mime default sapo-swarm.desktop x-scheme-handler/sapo >/dev/null 2>&1 || true; fi

echo "SAPO Swarm $VERSION is installed in $TARGET: SAPO Swarm in the menu, sapo-swarm and sapo-node in $BIN."
case ":$PATH:" in *":$BIN:"*) ;; *) echo "$BIN is not on your PATH: add it, or run $BIN/sapo-swarm" ;; esac
