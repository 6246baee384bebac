"""bench/cuda's offline tools on fixed inputs: ncu_sass_summary.py sums an
Nsight Compute source page (SASS, CSV) by opcode and stall reason;
ncu_decode_breakdown.py sets one decode step's kernels against the bandwidth
floor from a raw page. Pure Python: no GPU, no server."""
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
BREAKDOWN = os.path.join(ROOT, "bench", "cuda", "ncu_decode_breakdown.py")

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


def raw_page(launches):
    """A raw page as loom_cuda_bench under ncu writes it: the bench's lines, then a header, a units row and
    one row per launch (name, ns, bytes; ncu's thousands separators)."""
    out = io.StringIO()
    out.write("device: NVIDIA H200 (132 SMs)\nmeasured device-to-device copy: 1.00 TB/s (read + write)\n")
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(["ID", "Kernel Name", "Block Size", "gpu__time_duration.sum", "dram__bytes.sum"])
    writer.writerow(["", "", "", "ns", "byte"])
    for index, (name, nanoseconds, size) in enumerate(launches):
        writer.writerow([str(index), name, "(128, 1, 1)", f"{nanoseconds:,}", f"{size:,}"])
    return out.getvalue()


class NcuDecodeBreakdownTest(unittest.TestCase):
    LAUNCHES = [
        ("loom::<unnamed>::synthetic_bf16_kernel(__nv_bfloat16 *, long)", 90000, 10**9),  # init: before the step
        ("void loom::cuda::<unnamed>::embedding_kernel(const int *, float *)", 1000, 10**6),
        ("void loom::cuda::<unnamed>::attention_kernel<(int)128, (int)1, (int)0, (bool)0>(AttentionParams, "
         "const AttentionWorkItem *)", 3000, 2 * 10**6),
        ("void loom::cuda::<unnamed>::attention_kernel<(int)128, (int)1, (int)0, (bool)0>(AttentionParams, "
         "const AttentionWorkItem *)", 3000, 2 * 10**6),
        ("void loom::cuda::<unnamed>::add_rms_norm_kernel(float *, const float *)", 5000, 1000),
        ("void loom::cuda::<unnamed>::embedding_kernel(const int *, float *)", 1000, 10**6),  # the next step
        ("void loom::cuda::<unnamed>::add_rms_norm_kernel(float *, const float *)", 5000, 1000),
    ]

    def run_tool(self, page_text, *arguments):
        with tempfile.TemporaryDirectory() as directory:
            page, out = os.path.join(directory, "ncu.csv"), os.path.join(directory, "breakdown.json")
            with open(page, "w") as file:
                file.write(page_text)
            result = subprocess.run([sys.executable, BREAKDOWN, page, "--json", out, *arguments],
                                    capture_output=True, text=True, timeout=60)
            breakdown = None
            if result.returncode == 0:
                with open(out) as file:
                    breakdown = json.load(file)
        return result, breakdown

    def test_one_step_against_the_measured_copy_bandwidth(self):
        result, breakdown = self.run_tool(raw_page(self.LAUNCHES))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(breakdown["launches"], 4)  # embedding, 2 x attention, norm: not the init, not step 2
        self.assertAlmostEqual(breakdown["step_us"], 12.0)
        self.assertAlmostEqual(breakdown["bandwidth_Bps"], 1e12)
        self.assertAlmostEqual(breakdown["floor_us"], (5 * 10**6 + 1000) / 1e12 * 1e6)
        kernels = {k["kernel"]: k for k in breakdown["kernels"]}
        self.assertEqual(sorted(kernels), ["add_rms_norm_kernel", "attention_kernel<128, 1, 0, 0>", "embedding_kernel"])
        attention = kernels["attention_kernel<128, 1, 0, 0>"]
        self.assertEqual(attention["launches"], 2)
        self.assertAlmostEqual(attention["us_per_launch"], 3.0)
        self.assertAlmostEqual(attention["floor_us"], 4.0)
        self.assertAlmostEqual(attention["excess_us"], 2.0)  # 6 us for 4 MB at 1 TB/s
        self.assertAlmostEqual(attention["bandwidth_GBps"], 4e6 / 6e-6 / 1e9)
        norm = kernels["add_rms_norm_kernel"]
        self.assertAlmostEqual(norm["excess_us"], 5.0 - 0.001)
        self.assertEqual(breakdown["kernels"][0]["kernel"], "add_rms_norm_kernel")  # the largest excess first
        self.assertAlmostEqual(sum(k["share_of_excess"] for k in breakdown["kernels"]), 1.0)
        self.assertIn("4 launches", result.stdout)

    def test_an_explicit_bandwidth_and_a_missing_step_marker(self):
        result, breakdown = self.run_tool(raw_page(self.LAUNCHES), "--bandwidth", "2e12")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertAlmostEqual(breakdown["bandwidth_Bps"], 2e12)
        result, _ = self.run_tool(raw_page(self.LAUNCHES), "--step-kernel", "no_such_kernel")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("cannot tell where a step starts", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
