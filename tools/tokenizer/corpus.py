"""Tricky strings on which Loom's tokenizer must agree with HF `tokenizers`."""

import unicodedata

CAFE_NFD = unicodedata.normalize("NFD", "café")

TRICKY_STRINGS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "multiple     spaces    between   words",
    "tabs\tand\t\ttabs",
    "new\nline",
    "two\n\nnewlines and\r\nwindows\r\nline ends",
    "trailing newlines\n\n\n",
    "\n\n\nleading newlines",
    "   \n   \t  mixed whitespace   \n",
    "I'm sure you're right, we'll see; they've done it, he'd go, it's John's.",
    "I'M SHOUTING, YOU'RE WHISPERING, WE'LL SEE",
    "don't won't can't shouldn't",
    "Numbers: 1 12 123 1234 12345 1234567890",
    "3.14159 and 2,718,281 and -42 and 1e-9",
    "phone 555-0199, year 2024, version v1.2.3",
    "Ⅻ roman ½ fraction ² superscript ٣ arabic-indic digit",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { sum += a[i] * b[i]; }",
    "const x = {\"key\": [1, 2, 3], 'other': null};",
    "#include <vector>\nint main() { return 0; }",
    "    indented by four\n\tindented by tab",
    "https://example.com/path?query=1&other=two#anchor",
    "email: someone@example.org",
    "naïve café résumé coöperate",
    "caf" + "e\u0301 with combining acute (needs NFC)",
    "A\u030a ring, n\u0303 tilde, o\u0308 umlaut",
    "Hangul: \u1100\u1161\u11a8 decomposed, 각 composed",
    "日本語のテキストです。東京都",
    "中文文本，包括标点符号。你好世界！",
    "한국어 텍스트입니다",
    "Русский текст и ёлка",
    "Ελληνικά γράμματα",
    "עברית וערבית: مرحبا بالعالم",
    "हिन्दी पाठ",
    "emoji 😀 🎉🎉 👍🏽 👨‍👩‍👧‍👦 family",
    "flags 🇫🇷🇯🇵 and keycap 1️⃣",
    "math ∑∫√∞ ≠ ≤ ≥ and arrows → ← ↔",
    "zero\u200bwidth space and non\u00a0breaking\u00a0space",
    "ideographic\u3000space and em\u2003space",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "inline <|im_end|>special tokens<|endoftext|> inside text",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "almost special <|im_start and <|not_a_token|>",
    "repeated aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa letters",
    "!!!??? ...,,, ---___ ***",
    "MixedCASE camelCaseWord snake_case_word SCREAMING_CASE",
    "a\u0000null byte and \u0007bell and \u007fdelete",
    "ﬁ ligature ＦＵＬＬＷＩＤＴＨ ｶﾀｶﾅ",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


TRAINING_TEXT = """
The tokenizer splits text into words and then merges frequent pairs of bytes.
Hello world! Hello there, how are you doing today? I'm fine, thank you.
We'll see what they've done; it's a good day and you're right about that.
The quick brown fox jumps over the lazy dog while the cat sleeps on the mat.
def main():
    for i in range(10):
        print(i * 2 + 1)
    return {"result": [1, 2, 3], 'ok': True}
int add(int a, int b) { return a + b; }
Numbers like 2024, 3.14159, 1000000 and 42 appear in many documents.
naïve café résumé; 日本語のテキスト; 中文文本; 한국어; Русский текст; emoji 😀 🎉 👍
The model reads the prompt, the prompt becomes tokens, tokens become vectors.
Streaming output must never split a character across two messages.
"""
