"""A word-bigram text generator: next words are drawn from those that follow the last
word in corpus.txt. One response per word; the last one says why it ended (``stop``:
the corpus ended a sentence there and the draw took it; ``length``: max_tokens)."""

import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

END = "<end>"  # what follows a sentence's last word
WORD = re.compile(r"[\w'-]+[.,;:?!]?")


class Model:
    def load(self, context):
        text = (Path(context.version_path) / "corpus.txt").read_text(encoding="utf-8")
        following: dict[str, Counter] = defaultdict(Counter)
        for sentence in re.split(r"(?<=[.?!])\s+", text):
            words = WORD.findall(sentence)
            if not words:
                continue
            for word, after in zip(words, [*words[1:], END], strict=True):
                following[word.lower()][after] += 1
        self.following = {
            word: (list(after), np.array(list(after.values()), dtype=np.float64))
            for word, after in following.items()
        }
        self.starts = sorted(word for word in self.following if word.isalpha())

    async def execute(self, inputs):
        prompt = inputs["text_input"][0].decode("utf-8", errors="replace")
        max_tokens = int(inputs["max_tokens"][0]) if "max_tokens" in inputs else 64
        temperature = float(inputs["temperature"][0]) if "temperature" in inputs else 1.0
        top_p = float(inputs["top_p"][0]) if "top_p" in inputs else 1.0
        seed = int(inputs["seed"][0]) % (1 << 64) if "seed" in inputs else None
        stream = bool(inputs["stream"][0]) if "stream" in inputs else True
        rng = np.random.default_rng(seed)
        prompt_words = WORD.findall(prompt)
        known = [w.lower() for w in prompt_words if w.lower() in self.following]
        word = known[-1] if known else self.starts[int(rng.integers(len(self.starts)))]
        words: list[str] = []
        reason = "length"
        while len(words) < max_tokens:
            word = self._next(word, temperature, top_p, rng)
            if word == END:
                reason = "stop"
                break
            words.append(word)
            if stream:
                yield self._response(" " + word, len(prompt_words), 1, "")
            word = word.lower()
        if stream:
            yield self._response("", len(prompt_words), 0, reason)
        else:
            text = "".join(" " + word for word in words)
            yield self._response(text, len(prompt_words), len(words), reason)

    def _next(self, word, temperature, top_p, rng):
        if word not in self.following:
            return END
        after, counts = self.following[word]
        if temperature <= 0:
            return after[int(np.argmax(counts))]
        scaled = np.log(counts) / temperature  # in logs: a tiny temperature cannot overflow
        weights = np.exp(scaled - scaled.max())
        order = np.argsort(-weights, kind="stable")
        chances = weights[order] / weights.sum()
        kept = int(np.searchsorted(np.cumsum(chances), top_p) + 1)
        chosen = order[:kept]
        return after[int(rng.choice(chosen, p=weights[chosen] / weights[chosen].sum()))]

    @staticmethod
    def _response(text, prompt_tokens, output_tokens, finish_reason):
        return {
            "text_output": np.array([text.encode()], dtype=object),
            "num_input_tokens": np.array([prompt_tokens], dtype=np.uint32),
            "num_output_tokens": np.array([output_tokens], dtype=np.uint32),
            "finish_reason": np.array([finish_reason.encode()], dtype=object),
        }
