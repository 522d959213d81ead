"""Without numpy, views are memoryviews: the training and error tests again, in a
subprocess where SX_PYTHON_NO_NUMPY hides numpy from the binding."""
import os
import subprocess
import sys
import unittest

import sx


class NoNumpyTest(unittest.TestCase):
    @unittest.skipUnless(sx.HAVE_NUMPY, "numpy is absent: every other test already runs "
                                        "on the memoryview fallback")
    def test_training_without_numpy(self):
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(sx.__file__)))
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.pathsep.join(filter(None, [package_root, here, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, SX_PYTHON_NO_NUMPY="1", PYTHONPATH=path)
        check = "import sx; assert not sx.HAVE_NUMPY, 'numpy was not hidden'"
        subprocess.run([sys.executable, "-c", check], env=env, check=True)
        run = subprocess.run([sys.executable, "-m", "unittest", "test_training", "test_errors"],
                             env=env, capture_output=True, text=True, timeout=600)
        self.assertEqual(run.returncode, 0, run.stderr[-4000:])
        self.assertIn("OK", run.stderr)


if __name__ == "__main__":
    unittest.main()
