"""The ctypes mirrors and constants against sx_layout.json, which the C compiler wrote."""
import ctypes
import json
import os
import unittest

import sx
from sx import _lib


def load_layout():
    path = os.environ.get("SX_LAYOUT_JSON")
    if not path:
        raise unittest.SkipTest("SX_LAYOUT_JSON is not set (ctest sets it)")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class LayoutTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.layout = load_layout()

    def test_every_struct_is_mirrored(self):
        self.assertEqual(sorted(self.layout["structs"]), sorted(_lib.STRUCTS))

    def test_struct_sizes_alignments_and_fields(self):
        for name, spec in self.layout["structs"].items():
            cls = _lib.STRUCTS[name]
            with self.subTest(struct=name):
                self.assertEqual(ctypes.sizeof(cls), spec["size"], f"sizeof({name})")
                self.assertEqual(ctypes.alignment(cls), spec["align"], f"alignof({name})")
                self.assertEqual([f[0] for f in cls._fields_], [f["name"] for f in spec["fields"]],
                                 f"field order of {name}")
                for field in spec["fields"]:
                    descriptor = getattr(cls, field["name"])
                    self.assertEqual(descriptor.offset, field["offset"],
                                     f"offsetof({name}, {field['name']})")
                    self.assertEqual(descriptor.size, field["size"],
                                     f"sizeof({name}.{field['name']})")

    def test_constants(self):
        for name, value in self.layout["constants"].items():
            with self.subTest(constant=name):
                self.assertTrue(hasattr(sx, name), f"sx.{name} is missing")
                self.assertEqual(getattr(sx, name), value, name)

    def test_every_function_has_a_prototype(self):
        self.assertEqual(sorted(self.layout["functions"]), sorted(_lib.PROTOTYPES))

    def test_version_matches_the_header(self):
        self.assertEqual(list(sx.version()), self.layout["version"])
        # The package's version is the header's (and so CMake's and the wheel's).
        self.assertEqual(sx.__version__, "%d.%d.%d" % tuple(self.layout["version"]))

    def test_init_functions_set_struct_size(self):
        for name, cls in _lib.STRUCTS.items():
            if name not in _lib.INIT_FUNCTIONS:
                continue  # filled by the library alone (sx_param_state_t)
            extra = (_lib.SX_OPTIM_ADAMW,) if name == "sx_param_group_desc_t" else ()
            with self.subTest(struct=name):
                self.assertEqual(_lib.init_struct(cls, *extra).struct_size, ctypes.sizeof(cls))

    def test_version_check(self):
        _lib.check_version(10600)   # 1.6.0
        _lib.check_version(10705)   # a newer minor is fine
        with self.assertRaisesRegex(sx.LibraryError, r"1\.5\.0 does not fit .* x >= 6"):
            _lib.check_version(10500)  # an older minor lacks this binding's calls
        with self.assertRaisesRegex(sx.LibraryError, r"1\.4\.0 does not fit .* x >= 6"):
            _lib.check_version(10400)  # an older minor lacks this binding's calls
        with self.assertRaisesRegex(sx.LibraryError, "2.0.0"):
            _lib.check_version(20000)
        with self.assertRaisesRegex(sx.LibraryError, r"0\.9"):
            _lib.check_version(900)
        with self.assertRaisesRegex(sx.LibraryError, r"1\.0\.0 does not fit .* x >= 1"):
            _lib.check_version(10000, binding=(1, 1))

    def test_the_library_is_not_a_pydll(self):
        # A PyDLL would hold the GIL through every call, and collectives of ranks that
        # are threads of one process would deadlock.
        self.assertIs(type(_lib.lib), ctypes.CDLL)
        self.assertNotIsInstance(_lib.lib, ctypes.PyDLL)


if __name__ == "__main__":
    unittest.main()
