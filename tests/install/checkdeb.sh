#!/usr/bin/env bash
# The desktop app's .deb as a user gets it (scripts/package): built from BUILD_DIR, its contents
# listed and checked (the executables, the Python package for Debian's python3, the desktop
# entry, icon and MIME type; Depends naming Debian's Qt and QCustomPlot), then its GUI run from
# an extracted copy: --version, and a snapshot opened and exported offscreen.
# Usage: checkdeb.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
root="$1"; build="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }
deb="$(BUILD_DIR="$build" "$root/scripts/package")"
[ -f "$deb" ] || fail "scripts/package printed '$deb', which is not a file"
echo "built $deb ($(du -k "$deb" | cut -f1) KiB)"

contents="$(dpkg-deb -c "$deb")"
for f in ./usr/bin/shardscope ./usr/bin/shardscope-capture ./usr/bin/shardscope-check \
         ./usr/bin/shardscope-run ./usr/share/applications/shardscope.desktop \
         ./usr/share/icons/hicolor/scalable/apps/shardscope.svg \
         ./usr/share/mime/packages/shardscope.xml \
         ./usr/lib/python3/dist-packages/shardscope/__init__.py \
         ./usr/lib/python3/dist-packages/shardscope/run.py; do
  grep -qF " $f" <<<"$contents" || fail "the .deb lacks $f"
done
grep -qE " \./usr/lib/python3/dist-packages/shardscope/_native\.cpython-[0-9]+-.*\.so" <<<"$contents" \
  || fail "the .deb lacks the native module"
if grep -qE "tst_|/bench|\.a$|/include/" <<<"$contents"; then
  fail "the .deb carries test, benchmark or development files: $(grep -E 'tst_|/bench|\.a$|/include/' <<<"$contents" | head -3)"
fi
depends="$(dpkg-deb -f "$deb" Depends)"
echo "Depends: $depends"
for d in libqt6widgets6 libqcustomplot python3; do
  grep -q "$d" <<<"$depends" || fail "Depends lacks $d: $depends"
done
[ "$(dpkg-deb -f "$deb" Version)" = "$("$build/bin/shardscope-capture" --version | awk '{print $2}')" ] \
  || fail "the .deb's Version is not the release the executables print"

x="$(mktemp -d)"
trap 'rm -rf "$x"' EXIT
dpkg-deb -x "$deb" "$x"
version="$("$x/usr/bin/shardscope" --version)"
echo "$version"
[[ "$version" == "shardscope $(dpkg-deb -f "$deb" Version)" ]] || fail "--version says '$version'"
# A snapshot of a short run of the engine, opened by the extracted inspector and exported again.
"$build/bin/shardscope-train" --steps 3 --no-listen --snapshot-out "$x/run.shardscope.json.gz" >/dev/null
QT_QPA_PLATFORM=offscreen XDG_RUNTIME_DIR="$x" timeout 60 "$x/usr/bin/shardscope" \
  "$x/run.shardscope.json.gz" --export-snapshot "$x/again.json" --export-csv "$x/v.csv" --quit
grep -q '"format": *"shardscope-snapshot"' "$x/again.json" || fail "the exported snapshot is not one"
grep -q "unregistered_access" "$x/v.csv" || fail "the exported violations lack the run's tied read"
# The Python package and its commands, as Debian's python3 runs them.
PYTHONPATH= /usr/bin/python3 -c "import sys; sys.path.insert(0, '$x/usr/lib/python3/dist-packages'); import shardscope._native as n; assert n.__version__ == '$(dpkg-deb -f "$deb" Version)'"
"$x/usr/bin/shardscope-check" --help | grep -q "usage: shardscope-check" || fail "shardscope-check --help"
"$x/usr/bin/shardscope-run" --version | grep -q "^shardscope " || fail "shardscope-run --version"
echo "the .deb is whole: contents, Depends, the GUI, the Python package and its commands"
