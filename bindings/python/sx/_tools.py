"""The commands the wheel installs beside the package (pip puts them on PATH):
``sxckpt``, the checkpoint tool built with the library, which this runs from inside the
package."""
import os
import sys


def sxckpt():
    """Runs the package's sxckpt with this command's arguments (docs/format.md)."""
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "sxckpt")
    if not os.path.exists(exe):
        sys.exit("sxckpt: this installation of sx has no sxckpt (build it with CMake: target sxckpt)")
    os.execv(exe, [exe] + sys.argv[1:])
