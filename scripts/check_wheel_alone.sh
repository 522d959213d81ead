#!/usr/bin/env bash
# The repaired wheel where the system has none of the libraries it bundles: in a mount
# namespace of its own, each system copy of Gloo, libuv, ISA-L, hiredis, libibverbs and
# libnl reads as empty (/dev/null bound over the file), as on a machine without Debian's
# packages. The plain wheel, which links the system's, must then fail to import (proof
# that they are out of the loader's reach); the repaired one must import, train, save
# and run its commands (scripts/check_wheel.py --bundled).
# Usage (as root, from the repository root, after scripts/test.sh made the venvs):
#   scripts/check_wheel_alone.sh PLAIN_VENV_PYTHON REPAIRED_VENV_PYTHON
set -euo pipefail
plain="$1"
repaired="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
exec unshare --mount --propagation private bash -s "$plain" "$repaired" "$root" <<'INNER'
set -euo pipefail
plain="$1"; repaired="$2"; root="$3"
hidden=0
for f in /usr/lib/libgloo.so* /usr/lib/x86_64-linux-gnu/libuv.so* /usr/lib/x86_64-linux-gnu/libisal.so* \
         /usr/lib/x86_64-linux-gnu/libhiredis.so* /usr/lib/x86_64-linux-gnu/libibverbs.so* \
         /usr/lib/x86_64-linux-gnu/libnl-*.so*; do
  if [ -f "$f" ] && [ ! -L "$f" ]; then
    mount --bind /dev/null "$f"
    hidden=$((hidden + 1))
  fi
done
echo "hid $hidden system libraries from the loader"
cd /tmp
if env -u SX_LIBRARY -u PYTHONPATH -u LD_LIBRARY_PATH "$plain" -c "import sx; sx.version()" 2> /dev/null; then
  echo "the plain wheel imported without the system's libraries: they were not hidden" >&2
  exit 1
fi
echo "the plain wheel, which links the system's libraries, fails to import, as it should"
env -u SX_LIBRARY -u PYTHONPATH -u LD_LIBRARY_PATH "$repaired" "$root/scripts/check_wheel.py" --bundled
INNER
