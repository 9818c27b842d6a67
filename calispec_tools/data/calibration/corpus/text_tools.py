import re
from collections import Counter


def normalize_whitespace(text: str) -> str:
    """Collapse runs of spaces, tabs and newlines into single spaces and strip both ends."""
    return re.sub(r"\s+", " ", text).strip()


def sentences(text: str) -> list[str]:
    """Split text into sentences at '.', '!' or '?' followed by a space."""
    parts = re.split(r"(?<=[.!?])\s+", normalize_whitespace(text))
    return [p for p in parts if p]


def top_words(text: str, n: int = 5) -> list[tuple[str, int]]:
    """The n most common lowercase words, ties broken alphabetically."""
    words = re.findall(r"[a-z']+", text.lower())
    counts = Counter(words)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


def capitalize_words(text: str) -> str:
    result = []
    for word in text.split(" "):
        if word:
            result.append(word[0].upper() + word[1:])
        else:
            result.append(word)
    return " ".join(result)


def is_anagram(a: str, b: str) -> bool:
    """True if a and b use the same letters, ignoring case and spaces."""
    clean_a = sorted(a.replace(" ", "").lower())
    clean_b = sorted(b.replace(" ", "").lower())
    return clean_a == clean_b


def truncate(text: str, width: int, suffix: str = "...") -> str:
    """Shorten text to at most width characters, ending with suffix when cut."""
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[: width - len(suffix)] + suffix


def caesar_shift(text: str, shift: int) -> str:
    """Shift every ASCII letter by `shift` places, wrapping around the alphabet; other characters stay."""
    out = []
    for char in text:
        if char.isascii() and char.isalpha():
            base = ord("A") if char.isupper() else ord("a")
            out.append(chr(base + (ord(char) - base + shift) % 26))
        else:
            out.append(char)
    return "".join(out)


class WordIndex:
    """Maps every word to the line numbers where it appears."""

    def __init__(self) -> None:
        self.lines: dict[str, list[int]] = {}

    def add_document(self, text: str) -> None:
        for number, line in enumerate(text.splitlines(), start=1):
            for word in set(re.findall(r"\w+", line.lower())):
                self.lines.setdefault(word, []).append(number)

    def lookup(self, word: str) -> list[int]:
        return self.lines.get(word.lower(), [])
