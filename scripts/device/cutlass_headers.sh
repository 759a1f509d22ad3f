#!/usr/bin/env bash
# Pack CUTLASS's headers for an offline GPU machine: .whl/cutlass-VERSION-headers.tar.xz, which setup_env.sh unpacks.
#
#   bash scripts/device/cutlass_headers.sh [VERSION]      (on a machine with network; default 4.2.0)
#
# Downloads the nvidia-cutlass wheel (headers only, ~6 MB) and keeps include/ (cutlass, cute) and
# tools/util/include/ from its cutlass_library/source, the layout setup.py's _cutlass_include looks
# for under TSCALE_CUTLASS_DIR: about 1 MB compressed, small enough to carry.
set -euo pipefail
VERSION=${1:-4.2.0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps "nvidia-cutlass==${VERSION}" -d "$work/wheel"
python3 - "$work" <<'PY'
import glob, sys, zipfile
work = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{work}/wheel/*.whl")[0])
prefix = "cutlass_library/source/"
for name in wheel.namelist():
    if name.startswith((prefix + "include/", prefix + "tools/util/include/")) and not name.endswith("/"):
        wheel.extract(name, f"{work}/x")
PY
mkdir -p .whl
tar -cJf ".whl/cutlass-${VERSION}-headers.tar.xz" -C "$work/x/cutlass_library/source" include tools
echo ".whl/cutlass-${VERSION}-headers.tar.xz: $(du -h ".whl/cutlass-${VERSION}-headers.tar.xz" | cut -f1)"
