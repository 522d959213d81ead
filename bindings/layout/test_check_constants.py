#!/usr/bin/env python3
"""check_constants.py fails on what it is meant to catch: fake bindings, written the way
the real ones are, that miss a constant, mistype one, define one no header has, or list
one as omitted that they define. Run by ctest as bindings_constants_selftest."""
import os
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_constants  # noqa: E402

HEADERS = {"SX_VERSION_MAJOR": 1, "SX_VERSION_MINOR": 5, "SX_VERSION_NUMBER": 10500,
           "SX_OK": 0, "SX_ERR_TIMEOUT": 8, "SX_PREFETCH_NONE": -1, "SX_LOAD_ALLOW_EXTRA": 4,
           "SX_OPTIM_SGD": 1, "SX_OPTIM_ADAM": 2, "SX_OPTIM_ADAMW": 3}

GOOD = {
    "python/sx/_lib.py": """
        SX_VERSION_MAJOR = 1
        SX_VERSION_MINOR = 5
        SX_VERSION_NUMBER = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100
        SX_OK = 0
        SX_ERR_TIMEOUT = 8  # a comment
        SX_PREFETCH_NONE = -1
        SX_LOAD_ALLOW_EXTRA = 0x4
        SX_OPTIM_SGD = 1
        SX_OPTIM_ADAM = 2
        SX_OPTIM_ADAMW = 3
        """,
    "rust/sx-sys/src/lib.rs": """
        pub const SX_VERSION_MAJOR: u32 = 1;
        pub const SX_VERSION_MINOR: u32 = 5;
        pub const SX_VERSION_NUMBER: u32 = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100;
        pub const SX_OK: sx_status_t = 0;
        pub const SX_ERR_TIMEOUT: sx_status_t = 8;
        pub const SX_PREFETCH_NONE: i32 = -1;
        pub const SX_LOAD_ALLOW_EXTRA: u32 = 0x4;
        pub const SX_OPTIM_SGD: i32 = 1;
        pub const SX_OPTIM_ADAM: i32 = 2;
        pub const SX_OPTIM_ADAMW: i32 = 3;
        """,
    "go/sx.go": """
        package sx
        const (
        \tVersionMajor  = 1
        \tVersionMinor  = 5
        \tVersionNumber = VersionMajor*10000 + VersionMinor*100
        )
        const (
        \tOK         = C.SX_OK
        \tErrTimeout = C.SX_ERR_TIMEOUT // a comment
        )
        const PrefetchNone Prefetch = -1
        const (
        \tLoadAllowExtra = 0x4
        \tSGD   Optimizer = 1
        \tAdam  Optimizer = 2
        \tAdamW Optimizer = 3
        )
        """,
    "go/layout_test.go": """
        package sx
        var ours = map[string]int64{
        \t"SX_VERSION_MAJOR": VersionMajor, "SX_VERSION_MINOR": VersionMinor,
        \t"SX_VERSION_NUMBER": VersionNumber, "SX_OK": int64(OK), "SX_ERR_TIMEOUT": int64(ErrTimeout),
        \t"SX_PREFETCH_NONE": int64(PrefetchNone), "SX_LOAD_ALLOW_EXTRA": LoadAllowExtra,
        \t"SX_OPTIM_SGD": int64(SGD), "SX_OPTIM_ADAM": int64(Adam), "SX_OPTIM_ADAMW": int64(AdamW),
        }
        """,
    "julia/src/SX.jl": """
        module SX
        const SX_VERSION_MAJOR = 1
        const SX_VERSION_MINOR = 5
        const SX_VERSION_NUMBER = SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100
        const SX_OK = Int32(0)
        include("more.jl")
        end
        """,
    "julia/src/more.jl": """
        const SX_ERR_TIMEOUT = Int32(8)  # a comment
        const SX_PREFETCH_NONE = Int32(-1)
        const SX_LOAD_ALLOW_EXTRA, = UInt32.((0x4,))
        const SX_OPTIM_SGD, SX_OPTIM_ADAM,
              SX_OPTIM_ADAMW = Int32.(1:3)
        """,
}


class CheckConstants(unittest.TestCase):
    def run_check(self, changes=None, omitted=None, headers=HEADERS):
        with tempfile.TemporaryDirectory() as root:
            files = dict(GOOD)
            files.update(changes or {})
            files.update({f"{lang}/CONSTANTS_OMITTED": text for lang, text in (omitted or {}).items()})
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(textwrap.dedent(text))
            return check_constants.check(headers, root, check_constants.LANGS)

    def edit(self, path, old, new):
        self.assertIn(old, GOOD[path])
        return {path: GOOD[path].replace(old, new)}

    def test_the_good_bindings_pass(self):
        self.assertEqual(self.run_check(), [])

    def test_a_mistyped_value_is_named_in_every_language(self):
        cases = [("python/sx/_lib.py", "SX_ERR_TIMEOUT = 8", "SX_ERR_TIMEOUT = 9", "python"),
                 ("rust/sx-sys/src/lib.rs", "SX_PREFETCH_NONE: i32 = -1", "SX_PREFETCH_NONE: i32 = 1", "rust"),
                 ("go/sx.go", "SGD   Optimizer = 1", "SGD   Optimizer = 2", "go"),
                 ("julia/src/more.jl", "Int32.(1:3)", "Int32.(0:2)", "julia")]
        for path, old, new, lang in cases:
            with self.subTest(lang=lang):
                problems = self.run_check(self.edit(path, old, new))
                self.assertTrue(problems)
                self.assertTrue(all(p.startswith(lang + ":") for p in problems), problems)
                self.assertTrue(any("the headers say" in p for p in problems), problems)

    def test_a_go_constant_taken_from_the_wrong_c_name_is_named(self):
        problems = self.run_check(self.edit("go/sx.go", "= C.SX_ERR_TIMEOUT", "= C.SX_ERR_TIME_OUT"))
        self.assertEqual(len(problems), 1)
        self.assertIn("go: SX_ERR_TIMEOUT is C.SX_ERR_TIME_OUT at ", problems[0])

    def test_a_missing_constant_is_named(self):
        problems = self.run_check(self.edit("julia/src/SX.jl", "const SX_OK = Int32(0)\n", ""))
        self.assertEqual(problems, ["julia: SX_OK = 0 is missing (define it, or list it with a reason "
                                    "in julia/CONSTANTS_OMITTED)"])
        problems = self.run_check(self.edit("go/layout_test.go", '"SX_OK": int64(OK), ', ""))
        self.assertEqual(len(problems), 1)
        self.assertIn("go: SX_OK = 0 is missing", problems[0])

    def test_a_new_header_constant_fails_every_binding_until_added(self):
        headers = dict(HEADERS, SX_OPTIM_ADEMAMIX=13)
        problems = self.run_check(headers=headers)
        self.assertEqual(sorted(p.split(":")[0] for p in problems), sorted(check_constants.LANGS))
        self.assertTrue(all("SX_OPTIM_ADEMAMIX = 13 is missing" in p for p in problems), problems)

    def test_a_constant_no_header_defines_is_named(self):
        problems = self.run_check(self.edit("rust/sx-sys/src/lib.rs", "pub const SX_OK: sx_status_t = 0;",
                                            "pub const SX_OK: sx_status_t = 0;\npub const SX_ERR_GONE: i32 = 99;"))
        self.assertEqual(len(problems), 1)
        self.assertIn("rust: SX_ERR_GONE", problems[0])

    def test_the_omitted_list(self):
        missing = self.edit("julia/src/SX.jl", "const SX_OK = Int32(0)\n", "")
        self.assertEqual(self.run_check(missing, {"julia": "# why\nSX_OK: the binding throws instead\n"}), [])
        problems = self.run_check(None, {"julia": "SX_OK: listed, yet defined\n"})
        self.assertEqual(problems, ["julia: SX_OK is defined but also listed in CONSTANTS_OMITTED"])
        problems = self.run_check(missing, {"julia": "SX_OK: why\nSX_NOPE: no such constant\n"})
        self.assertEqual(problems, ["julia/CONSTANTS_OMITTED lists SX_NOPE, which no header defines"])
        with self.assertRaises(SystemExit):
            self.run_check(missing, {"julia": "SX_OK\n"})  # no reason

    def test_a_value_it_cannot_read_is_a_failure(self):
        problems = self.run_check(self.edit("python/sx/_lib.py", "SX_OK = 0", "SX_OK = int('0')"))
        self.assertEqual(len(problems), 1)
        self.assertIn("python: SX_OK", problems[0])
        self.assertIn("cannot evaluate", problems[0])


if __name__ == "__main__":
    unittest.main()
