"""The repository stands alone: no comment, test or document cites a file outside it (the design notes and
papers Loom was built from are cited as docs/design.md and by title and arXiv id), every repository path a
source file or document names exists, and every relative link in the Markdown docs resolves (anchors too)."""
import os
import re
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP_DIRS = {".git", ".venv", ".carry", ".whl", ".models", "__pycache__", "fixtures", "corpus", "results"}
TEXT_EXTENSIONS = (".h", ".cc", ".cu", ".cuh", ".py", ".sh", ".md", ".txt", ".cmake", ".json")
# Citations of files outside the repository: a design note or a text file cited by section, or the folders
# beside the checkout (papers are cited by title and arXiv id, the design as docs/design.md).
OUTSIDE = re.compile(r"\bDESIGN(?:\.md)?\s*§|(?<![\w/])DESIGN\.md|\.\./shared|shared/papers|"
                     r"\b[\w-]+\.txt\s*§")
# Repository paths named in text: a top-level folder, then a file with an extension.
PATH = re.compile(r"(?<![\w./-])((?:src|docs|bench|scripts|tests|tools)/[\w./-]*\w\.(?:h|cc|cu|cuh|md|py|sh|json))\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def repository_files():
    for directory, subdirectories, files in os.walk(ROOT):
        relative = os.path.relpath(directory, ROOT)
        top = relative.split(os.sep)[0]
        subdirectories[:] = [d for d in subdirectories if d not in SKIP_DIRS and not
                             (relative == "." and (d.startswith("build") or d.startswith(".")))]
        if top.startswith("build"):
            continue
        for name in files:
            if name.endswith(TEXT_EXTENSIONS) or name in ("CMakeLists.txt", "MODULES"):
                yield os.path.join(directory, name)


def anchors(markdown):
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    result = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            text = re.sub(r"[^\w\- ]", "", text)
            result.add(text.replace(" ", "-"))
    return result


class DocReferencesTest(unittest.TestCase):
    def test_nothing_cites_a_file_outside_the_repository(self):
        found = []
        for path in repository_files():
            if path.endswith("test_doc_references.py"):
                continue
            with open(path, errors="replace") as text:
                for number, line in enumerate(text, 1):
                    if OUTSIDE.search(line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()[:120]}")
        self.assertEqual(found, [], "\n".join(found))

    def test_every_named_repository_path_exists(self):
        missing = []
        for path in repository_files():
            if path.endswith("test_check_module_layers.py"):
                continue  # builds made-up source trees
            with open(path, errors="replace") as text:
                for number, line in enumerate(text, 1):
                    for match in PATH.finditer(line):
                        named = match.group(1)
                        if "*" in named or "<" in named or line[:match.start()].rstrip().endswith("--out"):
                            continue  # a pattern, or a file a command writes
                        # Includes name headers from src/.
                        if not any(os.path.exists(os.path.join(ROOT, base, named)) for base in ("", "src")):
                            missing.append(f"{os.path.relpath(path, ROOT)}:{number}: {named}")
        self.assertEqual(missing, [], "\n".join(missing))

    def test_every_relative_markdown_link_resolves(self):
        broken = []
        for path in repository_files():
            if not path.endswith(".md"):
                continue
            with open(path) as text:
                markdown = text.read()
            for target in LINK.findall(markdown):
                if re.match(r"[a-z]+:", target):
                    continue  # http:, https:, mailto:
                file_part, _, anchor = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(resolved):
                    broken.append(f"{os.path.relpath(path, ROOT)}: {target}")
                elif anchor and resolved.endswith(".md"):
                    with open(resolved) as linked:
                        if anchor not in anchors(linked.read()):
                            broken.append(f"{os.path.relpath(path, ROOT)}: {target} (no such heading)")
        self.assertEqual(broken, [], "\n".join(broken))


if __name__ == "__main__":
    unittest.main()
