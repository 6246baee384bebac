"""Prompt text: static contexts from a local file or synthesised, random
instructions and tool observations, all sized in tokens through a measured
tokens-per-word ratio. Nothing is downloaded.
"""
import random
import re
from typing import List, Optional

# Common English words: text made of them tokenizes to about one token per word
# with real BPE vocabularies; the ratio is measured against the server anyway.
WORDS = tuple(
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office door health "
    "person art war history party result change morning reason research girl guy moment air teacher force "
    "education".split())


class TextSource:
    """Makes text of about N tokens.

    tokens_per_word: measured by calibrate() against the server's tokenizer
    (1.0 until then). context_words: words of --context-file, or None to
    synthesise contexts from WORDS.
    """

    def __init__(self, context_words: Optional[List[str]] = None, tokens_per_word: float = 1.0):
        if context_words is not None and not context_words:
            raise ValueError("the context file has no words")
        self.context_words = context_words
        self.tokens_per_word = tokens_per_word

    @classmethod
    def from_file(cls, path: str) -> "TextSource":
        with open(path, encoding="utf-8", errors="replace") as file:
            words = re.findall(r"\S+", file.read())
        if not words:
            raise ValueError(f"{path}: no words in the context file")
        return cls(words)

    def num_words(self, num_tokens: int) -> int:
        return max(1, round(num_tokens / self.tokens_per_word))

    def random_words(self, rng: random.Random, num_tokens: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(self.num_words(num_tokens)))

    def context(self, index: int, num_tokens: int, seed: int) -> str:
        """Static context number `index`: the same text for the same (index,
        num_tokens, seed). From a file: consecutive words from an offset that
        depends on index (wrapping around); synthesised: seeded random words."""
        num_words = self.num_words(num_tokens)
        if self.context_words is None:
            rng = random.Random(f"context-{seed}-{index}")
            words = [rng.choice(WORDS) for _ in range(num_words)]
        else:
            start = (index * 7919 * num_words) % len(self.context_words)
            words = [self.context_words[(start + i) % len(self.context_words)] for i in range(num_words)]
        return f"Context {index}:\n" + " ".join(words)
