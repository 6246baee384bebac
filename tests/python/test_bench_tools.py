"""bench/cuda's offline tools on fixed inputs: ncu_sass_summary.py sums an
Nsight Compute source page (SASS, CSV) by opcode and stall reason. Pure
Python: no GPU, no server."""
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "cuda", "ncu_sass_summary.py")

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_wait", "stall_long_sb", "stall_wait (Not Issued)"]
ROWS = [  # address, source, samples, not issued, executed, wait, long_sb, wait (not issued)
    ["0x10", "      HMMA.16816.F32.BF16 R4, R8, R12, R4", "10", "6", "1000", "6", "4", "5"],
    ["0x20", "      FMUL R1, R2, R3", "3", "1", "4000", "1", "0", "1"],
    ["0x30", "  @P0 FMUL R1, R2, R3", "2", "2", "1000", "0", "2", "0"],
    ["0x40", "      LDGSTS.E.BYPASS.128 [R1], [R2.64]", "5", "5", "500", "0", "5", "0"],
    ["0x50", "      EXIT", "", "", "", "", "", ""],  # no counters: skipped
]


def ncu_csv():
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["Kernel Name", "void attention_kernel<(int)128, (int)1, (int)16, (bool)0>(...)"])
    writer.writerow(HEADER)
    writer.writerows(ROWS)
    return out.getvalue()


class NcuSassSummaryTest(unittest.TestCase):
    def test_sums_by_opcode_and_stall_reason(self):
        with tempfile.TemporaryDirectory() as directory:
            page, summary_path = os.path.join(directory, "sass.csv"), os.path.join(directory, "sass.json")
            with open(page, "w") as file:
                file.write(ncu_csv())
            result = subprocess.run([sys.executable, TOOL, page, "--json", summary_path], capture_output=True,
                                    text=True, timeout=60)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(summary_path) as file:
                summary = json.load(file)
        self.assertEqual(summary["instructions"], 6500)
        self.assertEqual(summary["stall_samples"], 20)
        opcodes = summary["opcodes"]
        self.assertEqual(list(opcodes)[0], "FMUL")  # most executed first; the predicated one counts as FMUL
        self.assertEqual(opcodes["FMUL"]["executed"], 5000)
        self.assertEqual(opcodes["FMUL"]["stall_samples"], 5)
        self.assertAlmostEqual(opcodes["HMMA"]["share"], 1000 / 6500)
        self.assertEqual(opcodes["LDGSTS"]["executed"], 500)
        self.assertNotIn("EXIT", opcodes)
        # stall reasons from the all-samples columns only, not the not-issued ones
        self.assertEqual(summary["stalls"]["stall_wait"]["samples"], 7)
        self.assertEqual(summary["stalls"]["stall_long_sb"]["samples"], 11)
        self.assertAlmostEqual(summary["stalls"]["stall_long_sb"]["share"], 11 / 20)
        self.assertNotIn("stall_wait (Not Issued)", summary["stalls"])
        self.assertIn("6,500 instructions", result.stdout)

    def test_a_page_without_the_columns_is_an_error(self):
        with tempfile.TemporaryDirectory() as directory:
            page = os.path.join(directory, "other.csv")
            with open(page, "w") as file:
                file.write('"ID","Kernel Name","Duration"\n"0","k","1"\n')
            result = subprocess.run([sys.executable, TOOL, page], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no SASS source page", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
