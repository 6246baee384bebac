"""bench/cuda's offline tools on fixed inputs: ncu_sass_summary.py sums an
Nsight Compute source page (SASS, CSV) by opcode and stall reason;
ncu_decode_breakdown.py sets one decode step's kernels against the bandwidth
floor from a raw page; sass_loops.py finds a kernel's loops and the order of
its waits in saved cuobjdump output. Pure Python: no GPU, no server."""
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
SASS_LOOPS = os.path.join(ROOT, "bench", "cuda", "sass_loops.py")

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


# cuobjdump -sass's layout: a header, then per function its name and one /*address*/ line per instruction.
SASS = """
\tcode for sm_90a
\t\tFunction : _Z11other_kernelv
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   EXIT ;                                  /* 0x000000000000794d */
\t\tFunction : _Z6kernelILi128EEvv
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING R2, 0x100 ;    /* 0x0000000000007b1d */
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT ; /* 0x00000000 */
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], R24, gsb0 ; /* 0x00000000 */
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;        /* 0x00000000 */
        /*0050*/                   MUFU.EX2 R3, R3 ;                      /* 0x00000000 */
        /*0060*/                   MUFU.EX2 R4, R4 ;                      /* 0x00000000 */
        /*0070*/                   FADD R5, R3, R4 ;                      /* 0x00000000 */
        /*0080*/               @P0 BRA 0x10 ;                             /* 0x00000000 */
        /*0090*/                   EXIT ;                                  /* 0x000000000000794d */
"""


class SassLoopsTest(unittest.TestCase):
    def run_tool(self, *args):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "kernel.sass")
            with open(path, "w") as file:
                file.write(SASS)
            return subprocess.run([sys.executable, SASS_LOOPS, path, *args], capture_output=True, text=True)

    def test_loops_and_the_order_of_waits_in_the_kernels_named(self):
        result = self.run_tool("--kernel", "ILi128E", "--order", "0:90")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("other_kernel", result.stdout)
        self.assertIn("10 instructions", result.stdout)
        # The backward branch at 0x80 closes a loop from 0x10: eight instructions, two of them HGMMA.
        self.assertIn("loop 10-80: 8 instructions", result.stdout)
        self.assertIn("HGMMA 2", result.stdout)
        self.assertIn("order: 10:BAR.SYNCx1 20:HGMMAx2 40:WARPGROUP.DEPBARx1 50:MUFUx2", result.stdout)

    def test_a_kernel_name_that_matches_nothing_fails(self):
        result = self.run_tool("--kernel", "no_such_kernel")
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no kernel name contains", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
