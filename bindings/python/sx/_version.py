"""The package's version: the library version it is built with and written for (CMake's
project version and sx.h's SX_VERSION_*; tests/test_layout.py checks they agree)."""
__version__ = "1.6.0"
