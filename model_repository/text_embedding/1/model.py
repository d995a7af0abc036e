"""Feature-hashing text embeddings: each word, and each letter trigram of a word, adds +1
or -1 (by its hash) to one of 256 buckets; the vector is then scaled to unit length."""

import re
import zlib

import numpy as np

DIMENSIONS = 256
WORD = re.compile(r"\w+")


def features(text: str) -> tuple[list[str], list[str]]:
    """(words, every feature: the words and their trigrams)."""
    words = WORD.findall(text.lower())
    padded = [f"<{word}>" for word in words]
    trigrams = [f"#{w[i : i + 3]}" for w in padded for i in range(len(w) - 2)]
    return words, words + trigrams


def embed(text: str) -> tuple[np.ndarray, int]:
    words, found = features(text)
    vector = np.zeros(DIMENSIONS, dtype=np.float32)
    for feature in found:
        hashed = zlib.crc32(feature.encode())
        vector[hashed % DIMENSIONS] += 1.0 if hashed & 0x80000000 else -1.0
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm else vector), len(words)


class Model:
    def execute(self, inputs):
        texts = inputs["text_input"][:, 0]
        vectors = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        counts = np.zeros((len(texts), 1), dtype=np.int32)
        for row, text in enumerate(texts):
            vectors[row], counts[row, 0] = embed(text.decode("utf-8", errors="replace"))
        return {"embedding": vectors, "num_input_tokens": counts}
