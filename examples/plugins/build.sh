#!/usr/bin/env bash
# Builds poimen's example plugins written in Python and JavaScript, from
# source, against the WIT in `wit/`:
#
#   word-count-py.wasm  (tool,     python/word-count/app.py)
#   max-words-py.wasm   (verifier, python/max-words/app.py)
#   word-count-js.wasm  (tool,     javascript/word-count/word-count.js)
#   contains-js.wasm    (verifier, javascript/contains/contains.js)
#
# into OUT (default: target/lang-plugins). The language tools are pinned and,
# when missing, installed under target/lang-tools: componentize-py from PyPI
# (with pip) and componentize-js from npm (with `npm ci` and the committed
# package-lock.json). Needs python3 with pip, and node with npm. A component
# newer than its source, the WIT and this script is not built again.
#
#   examples/plugins/build.sh [OUT]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/target/lang-plugins}
tools=$root/target/lang-tools
componentize_py_version=0.25.1

mkdir -p "$out" "$tools"
# One build at a time (test binaries, CI and a developer may all ask).
exec 9>"$tools/.build.lock"
flock 9

componentize_py() {
  PYTHONPATH="$tools/py" python3 -c \
    'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())' "$@"
}

componentize_js() {
  "$tools/js/node_modules/.bin/componentize-js" "$@"
}

install_tools() {
  if ! componentize_py --version 2>/dev/null | grep -q "componentize-py $componentize_py_version"; then
    echo "installing componentize-py $componentize_py_version into $tools/py" >&2
    python3 -m pip install --quiet --disable-pip-version-check --upgrade \
      --target "$tools/py" "componentize-py==$componentize_py_version"
  fi
  if ! cmp -s "$here/javascript/package-lock.json" "$tools/js/package-lock.json" \
    || [ ! -x "$tools/js/node_modules/.bin/componentize-js" ]; then
    echo "installing componentize-js (package-lock.json) into $tools/js" >&2
    mkdir -p "$tools/js"
    cp "$here/javascript/package.json" "$here/javascript/package-lock.json" "$tools/js/"
    (cd "$tools/js" && npm ci --silent --no-audit --no-fund)
  fi
}

# Whether `$1` is missing or older than any of the other arguments.
stale() {
  local target=$1
  shift
  [ -e "$target" ] || return 0
  for f in "$@"; do
    [ "$f" -nt "$target" ] && return 0
  done
  return 1
}

built=0
build() {
  local lang=$1 world=$2 source=$3 name=$4
  local target="$out/$name.wasm"
  if ! stale "$target" "$source" "$root/wit/plugin.wit" "$0"; then
    return
  fi
  if [ "$built" = 0 ]; then
    install_tools
    built=1
  fi
  echo "building $name ($lang, world $world)" >&2
  local started=$SECONDS
  case "$lang" in
    python)
      (cd "$(dirname "$source")" && componentize_py -d "$root/wit" -w "$world" \
        componentize "$(basename "$source" .py)" -o "$target.tmp")
      ;;
    javascript)
      # componentize-js reads and writes through a WASI sandbox rooted at
      # the working directory: paths relative to the repository, output
      # under target/ first.
      (cd "$root" && componentize_js "${source#"$root/"}" --wit wit --world-name "$world" \
        -o "target/lang-tools/$name.wasm")
      mv "$tools/$name.wasm" "$target.tmp"
      ;;
  esac
  mv "$target.tmp" "$target"
  echo "  $(du -h "$target" | cut -f1) in $((SECONDS - started)) s" >&2
}

build python tool "$here/python/word-count/app.py" word-count-py
build python verifier "$here/python/max-words/app.py" max-words-py
build javascript tool "$here/javascript/word-count/word-count.js" word-count-js
build javascript verifier "$here/javascript/contains/contains.js" contains-js
