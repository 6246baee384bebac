#include "synthetic/synthetic_tokenizer.h"

namespace loom {

const char* synthetic_tokenizer_corpus() {
  return R"CORPUS(The quick brown fox jumps over the lazy dog. The dog does not mind; it is asleep in the sun.
Once upon a time, there was a small town by the river. People in the town worked, talked and
laughed together, and every evening they gathered in the square to share the news of the day.
"Where are you going?" she asked. "To the market," he said, "and then back home for dinner."
I'm sure you're right: we'll see what they've done, and it's clear that he'd rather stay.
Language models read text as tokens. A tokenizer splits the text into words, and byte pair
encoding merges the most frequent pairs of symbols until the vocabulary is large enough.
The model then predicts the next token, one step at a time, and the server streams it back.
Agents share a long context: a codebase, a document, a catalogue of tools. Each agent adds its
own short history, and the cache keeps the shared prefix so that nobody computes it twice.

def fibonacci(n):
    """Returns the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, value=1):
        self.counts[key] = self.counts.get(key, 0) + value
        return self.counts[key]

for i in range(10):
    print(f"{i}: {fibonacci(i)}")

#include <cstdio>
#include <vector>

int sum(const std::vector<int>& values) {
  int total = 0;
  for (int value : values) total += value;
  return total;
}

int main(int argc, char** argv) {
  std::vector<int> values = {1, 2, 3, 4, 5};
  std::printf("sum = %d\n", sum(values));
  return 0;
}

const config = { "name": "loom", "version": "0.1.0", "port": 8080, "debug": false };
function greet(name) { return `Hello, ${name}!`; }
SELECT id, name, created_at FROM users WHERE age >= 18 ORDER BY created_at DESC LIMIT 100;
<html><body><p class="note">Hello &amp; welcome</p></body></html>

Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 99 100 128 256 512 1024 2048 4096 65536 1000000
Dates and versions: 2023-01-15, 2024-12-31, 12:30:45, v1.2.3, 3.14159, 2.71828, -273.15, 6.02e23
Phone 555-0100, order #12345, price $19.99, discount 15%, ratio 3:2, total 1,234,567.89

Français : le café est très bon, l'été arrive bientôt, où est la gare ?
Deutsch: Grüße aus München, die Straße ist schön, Äpfel und Öl.
Español: ¿Dónde está la biblioteca? ¡Mañana será un gran día!
Русский: Привет, мир! Как дела? Всё хорошо.
Ελληνικά: Γεια σου κόσμε.
日本語：こんにちは、世界。東京は大きな都市です。
中文：你好，世界。今天天气很好。
한국어: 안녕하세요, 세계.
العربية: مرحبا بالعالم
हिन्दी: नमस्ते दुनिया
Emoji: 😀 😂 🎉 👍 ❤️ 🚀 🌍 ✨ 🤖 👩‍💻
Math: ∑ ∫ √ ∞ ≈ ≠ ≤ ≥ π θ λ μ → ← ↔ ✓ ✗ °C ½ ¼ ² ³

The end of the corpus. The end. The end!
)CORPUS";
}

}  // namespace loom
