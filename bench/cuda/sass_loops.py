#!/usr/bin/env python3
"""A kernel's SASS without a GPU: compiles a .cu to a cubin for sm_90a with the build's flags,
disassembles it (cuobjdump and nvdisasm from the PyPI wheels nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm, installed into .venv when missing) and prints, for each kernel whose name contains --kernel, its instruction count, every
loop (a backward branch) with its opcode mix, and the order of the synchronizing instructions in
an address range: where a wait landed, how many instructions a tile costs.

    python3 bench/cuda/sass_loops.py src/backend/cuda/attention_pingpong.cu --kernel ILi128ELb0E
    python3 bench/cuda/sass_loops.py src/backend/cuda/attention.cu --kernel ILi128ELi1ELi16ELb0E \
        --order 7aa0:cc30

This is how the prefill-attention round of issue 43 found exp2f's range check, the producer's
address arithmetic and where ptxas put the wait for PV (bench/README.md)."""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NVCC_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-std=c++17"]
MARKERS = ["BAR.SYNC", "BAR.ARV", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "SYNCS.PHASECHK", "SYNCS.ARRIVE",
           "HGMMA", "HMMA", "MUFU", "SHFL", "VOTE", "F2FP", "LDGSTS", "FENCE"]


def cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    python = venv_python if os.path.exists(venv_python) else sys.executable

    def wheel_binary(tool):
        code = "import nvidia, os; print(os.pathsep.join(nvidia.__path__))"
        result = subprocess.run([python, "-c", code], capture_output=True, text=True)
        for base in result.stdout.strip().split(os.pathsep):
            for sub in ("cu13/bin", "cu12/bin"):
                path = os.path.join(base, sub, tool)
                if base and os.path.exists(path):
                    os.chmod(path, 0o755)
                    return path
        return None

    if wheel_binary("cuobjdump") is None or wheel_binary("nvdisasm") is None:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm"],
                       check=True)
    path, disassembler = wheel_binary("cuobjdump"), wheel_binary("nvdisasm")
    if path is None or disassembler is None:
        sys.exit("sass_loops: no cuobjdump on PATH, and the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels lack it")
    os.environ["NVDISASM_PATH"] = os.path.dirname(disassembler)  # cuobjdump runs nvdisasm
    return path


def sass_of(args):
    if args.source.endswith(".sass"):  # cuobjdump -sass output saved earlier
        with open(args.source) as file:
            return file.read()
    if args.source.endswith(".cubin"):
        return disassemble(args.source)
    with tempfile.TemporaryDirectory() as directory:
        cubin = os.path.join(directory, "kernel.cubin")
        command = ["nvcc", *NVCC_FLAGS, "-I", os.path.join(ROOT, "src"), *args.nvcc_flag, "-cubin", args.source,
                   "-o", cubin]
        result = subprocess.run(command, capture_output=True, text=True)
        for line in result.stderr.splitlines():
            if "C7514" in line or "error" in line:  # ptxas serializing wgmma, or the failure
                print(line)
        if result.returncode != 0:
            sys.exit(result.stderr)
        return disassemble(cubin)


def disassemble(cubin):
    return subprocess.run([cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout


def functions(sass):
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        instructions = []
        for line in chunk.split("\n"):
            match = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if match:
                instructions.append((int(match.group(1), 16), match.group(2).strip()))
        yield name, instructions


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def report(name, instructions, order):
    print(f"{name}\n  {len(instructions)} instructions")
    for address, text in instructions:
        target = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            start = int(target.group(1), 16)
            body = [t for a, t in instructions if start <= a <= address]
            mix = collections.Counter(opcode(t) for t in body)
            print(f"  loop {start:x}-{address:x}: {len(body)} instructions, "
                  + ", ".join(f"{op} {n}" for op, n in mix.most_common(12)))
    if order:
        low, high = (int(x, 16) for x in order.split(":"))
        sequence = []
        for address, text in instructions:
            if not low <= address <= high:
                continue
            marker = next((m for m in MARKERS if m in text), None)
            if marker is None:
                continue
            if sequence and sequence[-1][1] == marker:
                sequence[-1][2] += 1
            else:
                sequence.append([address, marker, 1])
        print("  order: " + " ".join(f"{a:x}:{m}x{n}" for a, m, n in sequence))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a .cu file (compiled for sm_90a), a .cubin, or saved cuobjdump -sass output (.sass)")
    parser.add_argument("--kernel", default="", help="substring of the mangled kernel names to report")
    parser.add_argument("--order", help="HEX:HEX address range whose synchronizing instructions to list in order")
    parser.add_argument("--nvcc-flag", action="append", default=[], help="an extra nvcc flag (repeatable)")
    args = parser.parse_args()
    matched = 0
    for name, instructions in functions(sass_of(args)):
        if args.kernel in name:
            matched += 1
            report(name, instructions, args.order)
    if matched == 0:
        sys.exit(f"sass_loops: no kernel name contains '{args.kernel}'")


if __name__ == "__main__":
    main()
