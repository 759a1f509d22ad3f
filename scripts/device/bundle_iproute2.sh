#!/usr/bin/env bash
# Carry iproute2's `ip` and `tc` to a machine that lacks them: the two binaries, every shared library
# they load (the dynamic loader and libc included) and wrappers that run them through that loader.
#
#   bash scripts/device/bundle_iproute2.sh OUT_DIR      (on a machine that has iproute2)
#   PATH=OUT_DIR/bin:$PATH bash scripts/device/sync_1bit_cpu.sh ...   (on the one that does not)
#
# The wrappers call the bundled loader with --library-path instead of setting LD_LIBRARY_PATH, so
# the programs that `ip netns exec` starts (python, the training processes) run on the machine's
# own libraries. The namespaces and qdiscs still need the kernel's support and root (CAP_NET_ADMIN,
# CAP_SYS_ADMIN); sync_1bit_cpu.sh probes for them and says what is missing.
set -euo pipefail
OUT=${1:?usage: bundle_iproute2.sh OUT_DIR}
mkdir -p "$OUT/bin" "$OUT/real" "$OUT/lib"
loader=""
for tool in ip tc; do
  path=$(readlink -f "$(command -v "$tool")") || { echo "bundle_iproute2: no '$tool' here" >&2; exit 3; }
  cp "$path" "$OUT/real/$tool"
  while read -r lib; do
    cp -L "$lib" "$OUT/lib/"
    case $lib in */ld-linux*) loader=$(basename "$lib") ;; esac
  done < <(ldd "$path" | grep -o '/[^ ]*\.so[^ ]*')
done
[ -n "$loader" ] || { echo "bundle_iproute2: no dynamic loader among the libraries" >&2; exit 3; }
for tool in ip tc; do
  cat > "$OUT/bin/$tool" <<EOF
#!/bin/sh
here=\$(dirname "\$(readlink -f "\$0")")/..
exec "\$here/lib/$loader" --library-path "\$here/lib" "\$here/real/$tool" "\$@"
EOF
  chmod +x "$OUT/bin/$tool"
done
echo "bundled ip and tc with $(ls "$OUT/lib" | wc -l) libraries ($(du -sh "$OUT" | cut -f1)) into $OUT"
