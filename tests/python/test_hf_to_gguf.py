"""bench/serve/hf_to_gguf.py (an HF Llama directory as an F16 GGUF, for serving the same weights with Loom and
llama.cpp): Loom reads the GGUF back as the same model. The tiny random model's greedy tokens and their
logprobs from the GGUF match those from the HF directory (up to F16 rounding), which fails if a tensor
is misnamed, q/k rows are permuted wrongly, rope scaling is lost or the tokenizer differs."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from loom_server import loom_binary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "serve", "hf_to_gguf.py")


def generate(model, messages):
    out = subprocess.run([loom_binary(), "generate", "--model", model, "--messages", json.dumps(messages),
                          "--max-tokens", "12", "--temperature", "0", "--json", "--logprobs", "1"],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    return json.loads(out)


class HfToGgufTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise unittest.SkipTest("the gguf package is missing (scripts/python-requirements.txt)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.hf = os.path.join(cls.tmp.name, "hf")
        subprocess.run([loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny", "--out", cls.hf],
                       check=True, capture_output=True, timeout=120)
        # Loom's GGUF reader takes Llama 3 rope scaling in the one form real Llama 3 checkpoints have
        # (original context 8192); the tiny preset uses 1024.
        config_path = os.path.join(cls.hf, "config.json")
        config = json.load(open(config_path))
        for key in ("rope_parameters", "rope_scaling"):
            if key in config:
                config[key]["original_max_position_embeddings"] = 8192
        json.dump(config, open(config_path, "w"))
        cls.gguf = os.path.join(cls.tmp.name, "tiny.gguf")
        subprocess.run([sys.executable, TOOL, cls.hf, cls.gguf], check=True, capture_output=True, timeout=120)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_gguf_generates_what_the_hf_directory_generates(self):
        messages = [{"role": "user", "content": "Write a function that adds two numbers, then explain it."}]
        hf, gguf = generate(self.hf, messages), generate(self.gguf, messages)
        self.assertEqual(hf["prompt_tokens"], gguf["prompt_tokens"])  # tokenizer and chat template
        self.assertEqual(hf["tokens"], gguf["tokens"])
        for a, b in zip(hf["top_logprobs"], gguf["top_logprobs"]):
            self.assertAlmostEqual(a[0][1], b[0][1], delta=0.02)

    def test_the_file_is_f16_with_llama_cpp_metadata(self):
        import gguf
        reader = gguf.GGUFReader(self.gguf)
        self.assertEqual(reader.fields["general.architecture"].contents(), "llama")
        self.assertEqual(reader.fields["tokenizer.ggml.pre"].contents(), "llama-bpe")
        types = {t.name: t.tensor_type for t in reader.tensors}
        self.assertEqual(types["blk.0.attn_q.weight"], gguf.GGMLQuantizationType.F16)
        self.assertEqual(types["blk.0.attn_norm.weight"], gguf.GGMLQuantizationType.F32)
        self.assertEqual(types["rope_freqs.weight"], gguf.GGMLQuantizationType.F32)
        self.assertEqual(len(reader.fields["tokenizer.ggml.tokens"].data), 512)

    def test_a_model_that_is_not_llama_is_refused(self):
        qwen = os.path.join(self.tmp.name, "qwen")
        subprocess.run([loom_binary(), "make-model", "--arch", "qwen2", "--preset", "tiny", "--out", qwen],
                       check=True, capture_output=True, timeout=120)
        result = subprocess.run([sys.executable, TOOL, qwen, os.path.join(self.tmp.name, "q.gguf")],
                                capture_output=True, text=True, timeout=120)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("Llama only", result.stderr)


if __name__ == "__main__":
    unittest.main()
