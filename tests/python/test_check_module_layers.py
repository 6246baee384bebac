"""scripts/check_module_layers.py on small trees: passes when every include
looks down, fails (naming file, line and modules) on an upward include, an
include of no module, a file outside every module, or a cyclic table."""
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check_module_layers.py"

TABLE = """\
# module: modules it may include
util:
model: util
backend: util model
backend_cpu: util model backend
"""


class CheckModuleLayersTest(unittest.TestCase):
    def run_checker(self, files, table=TABLE):
        with tempfile.TemporaryDirectory() as directory:
            src = pathlib.Path(directory) / "src"
            for name, text in {"MODULES": table, **files}.items():
                path = src / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            result = subprocess.run([sys.executable, str(SCRIPT), "--src", str(src)],
                                    capture_output=True, text=True)
            return result.returncode, result.stderr

    def test_downward_includes_pass(self):
        code, errors = self.run_checker({
            "util/error.h": "#pragma once\n#include <string>\n",
            "model/config.h": '#include "util/error.h"\n#include "model/weights.h"\n',
            "backend/cpu/kernels.cc": '#include "backend/backend.h"\n#include "model/config.h"\n'
                                      '#include "backend/cpu/kernels.h"\n#include "local.h"\n',
        })
        self.assertEqual(code, 0, errors)

    def test_upward_include_fails(self):
        code, errors = self.run_checker({
            "util/error.h": "#pragma once\n",
            "model/config.cc": '#include "util/error.h"\n\n#include "backend/backend.h"\n',
        })
        self.assertEqual(code, 1)
        self.assertIn('src/model/config.cc:3: model includes "backend/backend.h" of module backend', errors)
        self.assertIn("model may include only: util", errors)

    def test_nested_module_is_its_own_module(self):
        # backend/ may not include backend/cpu/ although the directory nests.
        code, errors = self.run_checker({"backend/backend.cc": '#include "backend/cpu/kernels.h"\n'})
        self.assertEqual(code, 1)
        self.assertIn("backend includes \"backend/cpu/kernels.h\" of module backend_cpu", errors)

    def test_unknown_module_and_stray_file_fail(self):
        code, errors = self.run_checker({
            "model/config.cc": '#include "engine/engine.h"\n',
            "stray/file.h": "#pragma once\n",
        })
        self.assertEqual(code, 1)
        self.assertIn('includes "engine/engine.h", which is in no module', errors)
        self.assertIn("src/stray/file.h: not inside any module", errors)

    def test_cyclic_table_fails(self):
        code, errors = self.run_checker({}, table="util: model\nmodel: util\n")
        self.assertEqual(code, 1)
        self.assertIn("cycle", errors)


if __name__ == "__main__":
    unittest.main(verbosity=2)
