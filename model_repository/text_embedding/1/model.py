"""Bag-of-n-grams text embeddings: a text's words and its letter trigrams are counted in
4096 hashed buckets, and the counts are projected to 256 dimensions by a fixed random
matrix (seeded, made when the model loads: nothing downloaded) and scaled to unit length.
Texts that share words and word pieces point the same way. The projection runs once per
batch, as a real encoder's layers do, so batches cost less per text than single texts."""

import re
import zlib

import numpy as np

BUCKETS = 4096
DIMENSIONS = 256
WORD = re.compile(r"\w+")
_MIX = np.uint64(2654435761)  # Knuth's multiplicative hash, for trigram codes


def counts(text: str, row: np.ndarray) -> int:
    """Add ``text``'s word and trigram counts into ``row``; returns its number of words."""
    lowered = text.lower()
    words = WORD.findall(lowered)
    for word in words:
        row[zlib.crc32(word.encode()) % BUCKETS] += 1.0
    data = np.frombuffer(f" {lowered} ".encode(), dtype=np.uint8).astype(np.uint64)
    if len(data) >= 3:
        codes = (data[:-2] << np.uint64(16)) | (data[1:-1] << np.uint64(8)) | data[2:]
        hashed = ((codes * _MIX) % np.uint64(BUCKETS)).astype(np.int64)
        row += np.bincount(hashed, minlength=BUCKETS)
    return len(words)


class Model:
    def load(self, context):
        rng = np.random.default_rng(0)
        self.projection = rng.standard_normal((BUCKETS, DIMENSIONS)).astype(np.float32)

    def execute(self, inputs):
        texts = inputs["text_input"][:, 0]
        found = np.zeros((len(texts), BUCKETS), dtype=np.float32)
        words = np.zeros((len(texts), 1), dtype=np.int32)
        for index, text in enumerate(texts):
            words[index, 0] = counts(text.decode("utf-8", errors="replace"), found[index])
        vectors = found @ self.projection
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return {"embedding": vectors / np.maximum(norms, 1e-12), "num_input_tokens": words}
