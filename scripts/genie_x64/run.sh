#!/bin/sh
# Issue 48 item 4, an experiment (docs/backends.md "Genie on the simulator"): a bundle's
# genie_config.json through the x64 Genie.dll of the ortqnn kit (onnxruntime-qnn 2.7.0
# win_amd64), under Wine, on QAIRT's x64 HTP simulator. In no task or test: it does not produce
# text yet, and says where it stops.
#   scripts/genie_x64/run.sh BUNDLE_DIR "PROMPT"      (the kit extracted: `doit bundle backend=ortqnn`)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=$(cd "$1" && pwd)
KIT=${HEXBUNDLE_ORTQNN_KIT:-}
if [ -z "$KIT" ]; then
    for dir in "${XDG_CACHE_HOME:-$HOME/.cache}"/hexbundle/ortqnn-*/; do KIT=$dir; break; done
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/genie-x64.XXXXXX")
x86_64-w64-mingw32-gcc -O1 -Wall -o "$WORK/genie_try.exe" "$HERE/genie_try.c"
# Wine 8 has no bcryptprimitives.dll; Genie.dll imports ProcessPrng from it
x86_64-w64-mingw32-gcc -shared -O1 -o "$WORK/bcryptprimitives.dll" "$HERE/bcryptprimitives.c" -ladvapi32
cp "$BUNDLE"/*.json "$BUNDLE"/*.bin "$WORK/"
cd "$WORK"
export WINEPREFIX="$KIT/wineprefix" WINEDEBUG=-all
export WINEDLLOVERRIDES="msvcp140,msvcp140_1,msvcp140_2,msvcp140_atomic_wait,msvcp140_codecvt_ids,concrt140,vcruntime140,vcruntime140_1,vcomp140=n,b;winedbg.exe=d"
WINEPATH="Z:$(printf '%s' "${KIT%/}/bin" | sed 's|/|\\|g')"
export WINEPATH
echo "genie-x64: in $WORK" >&2
exec timeout 900 "${HEXBUNDLE_WINE64:-/usr/lib/wine/wine64}" ./genie_try.exe genie_config.json "$2"
