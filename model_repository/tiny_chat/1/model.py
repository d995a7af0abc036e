"""A word-bigram text generator with the tensors of Triton's vLLM backend: next words are
drawn from those that follow the last word in corpus.txt, a word standing for a token.

As vLLM's backend (triton-inference-server/vllm_backend, src/utils/request.py) reads a
request: ``sampling_parameters`` is a JSON object (``max_tokens`` 16, ``min_tokens`` 0,
``temperature`` 1, ``top_p`` 1, ``seed``, ``stop``, ``ignore_eos``; numbers may come as
strings, as genai-perf sends them; vLLM's other keys are taken and have no use here);
``stream`` is false unless given (one response with the whole text); the prompt is put
before the text unless ``exclude_input_in_output`` is true, and never when streaming.
Streamed, each response holds the next word and the last one says why the text ended
(``stop``: the corpus ended a sentence there and the draw took it, or a stop string came;
``length``: max_tokens). Every response carries every output: vLLM sends its optional
ones only when a ``return_*`` input asks, but a model here answers each declared output,
and a client reads only those it wants.

The text is never empty: a sentence that ends before ``min_tokens`` words (at least one)
is followed by a new one, as is every sentence with ``ignore_eos``. Settings that cannot
be read raise ``reposerve.InvalidInput``: the client gets a 400 naming the input.
"""

import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from reposerve import InvalidInput

END = "<end>"  # what follows a sentence's last word
WORD = re.compile(r"[\w'-]+[.,;:?!]?")
# vLLM's SamplingParams defaults, for the keys this generator uses
DEFAULTS = {
    "max_tokens": 16,
    "min_tokens": 0,
    "temperature": 1.0,
    "top_p": 1.0,
    "seed": None,
    "stop": [],
    "ignore_eos": False,
}


class Model:
    def load(self, context):
        self.name = Path(context.version_path).parent.name  # for errors: the model's folder
        text = (Path(context.version_path) / "corpus.txt").read_text(encoding="utf-8")
        following: dict[str, Counter] = defaultdict(Counter)
        openers: Counter = Counter()
        for sentence in re.split(r"(?<=[.?!])\s+", text):
            words = WORD.findall(sentence)
            if not words:
                continue
            openers[words[0]] += 1
            for word, after in zip(words, [*words[1:], END], strict=True):
                following[word.lower()][after] += 1
        self.following = {word: _choices(after) for word, after in following.items()}
        self.openers = _choices(openers)
        self.starts = sorted(word for word in self.following if word.isalpha())

    async def execute(self, inputs):
        prompt = inputs["text_input"][0].decode("utf-8", errors="replace")
        stream = _switch(inputs, "stream", False)
        exclude = _switch(inputs, "exclude_input_in_output", stream)
        if stream and not exclude:
            raise InvalidInput(
                f"model '{self.name}': input 'exclude_input_in_output': false is not allowed "
                "when streaming (vLLM's rule: the prompt is sent once, not before every word)"
            )
        settings = _sampling(inputs, f"model '{self.name}': input 'sampling_parameters'")
        rng = np.random.default_rng(None if settings["seed"] is None else settings["seed"] % 2**64)
        prompt_words = WORD.findall(prompt)
        known = [w.lower() for w in prompt_words if w.lower() in self.following]
        word = known[-1] if known else self.starts[int(rng.integers(len(self.starts)))]
        stops = Stops(settings["stop"])
        least = max(settings["min_tokens"], 1)  # never an empty text
        count, logprob, reason = 0, 0.0, "length"
        text, reported = ("" if exclude else prompt), 0  # what is not sent yet, and counted
        while count < settings["max_tokens"]:
            word, chance = self._draw(self.following[word], settings, rng)
            if word == END:
                if count >= least and not settings["ignore_eos"]:
                    reason = "stop"
                    break
                word, chance = self._draw(self.openers, settings, rng)  # a new sentence
            count += 1
            logprob += math.log(chance)
            text += stops.feed(" " + word)
            if stops.found:
                reason = "stop"
                break
            if stream and text:
                yield _response(text, len(prompt_words), count - reported, logprob, "")
                text, reported = "", count
            word = word.lower()
        text += stops.rest()
        yield _response(text, len(prompt_words), count - reported, logprob, reason)

    @staticmethod
    def _draw(choices, settings, rng):
        """A word from ``choices`` (words and their counts) with the chance it was drawn
        with, after temperature and top_p."""
        words, counts = choices
        if settings["temperature"] <= 0:
            return words[int(np.argmax(counts))], 1.0
        scaled = np.log(counts) / settings["temperature"]  # in logs: no overflow
        weights = np.exp(scaled - scaled.max())
        order = np.argsort(-weights, kind="stable")
        chances = weights[order] / weights.sum()
        kept = order[: int(np.searchsorted(np.cumsum(chances), settings["top_p"]) + 1)]
        chances = weights[kept] / weights[kept].sum()
        at = int(rng.choice(len(kept), p=chances))
        return words[int(kept[at])], float(chances[at])


class Stops:
    """The text as it comes, up to the first stop string: ``feed`` gives what may go out
    now, holding back an end that may begin a stop string; ``found`` once one came."""

    def __init__(self, stops):
        self.stops = stops
        self.held = ""
        self.found = False

    def feed(self, text):
        held = self.held + text
        found = [at for at in (held.find(stop) for stop in self.stops) if at >= 0]
        if found:
            self.found = True
            return held[: min(found)]
        keep = max(
            (
                size
                for stop in self.stops
                for size in range(1, len(stop))
                if held.endswith(stop[:size])
            ),
            default=0,
        )
        self.held = held[len(held) - keep :]
        return held[: len(held) - keep]

    def rest(self):
        """What is held back at the end of the text: none of it began a stop string."""
        return "" if self.found else self.held


def _choices(counted):
    return list(counted), np.array(list(counted.values()), dtype=np.float64)


def _switch(inputs, name, default):
    return bool(inputs[name][0]) if name in inputs else default


def _sampling(inputs, where):
    """``sampling_parameters`` read as vLLM reads them: vLLM's defaults for what is left
    out, numbers as numbers or as strings of them."""
    given = {}
    if "sampling_parameters" in inputs:
        try:
            given = json.loads(inputs["sampling_parameters"][0])
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidInput(f"{where}: not a JSON object: {exc}") from None
        if not isinstance(given, dict):
            raise InvalidInput(f"{where}: a JSON object, got {type(given).__name__}")
    settings = dict(DEFAULTS)
    for key, kind in (("max_tokens", int), ("min_tokens", int), ("seed", int),
                      ("temperature", float), ("top_p", float)):  # fmt: skip
        value = given.get(key)
        if value is None:
            continue
        try:
            settings[key] = kind(value)
        except (TypeError, ValueError):
            raise InvalidInput(f"{where}: {key}: expected {kind.__name__}, got {value!r}") from None
    stop = given.get("stop") or []
    settings["stop"] = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in settings["stop"]):
        raise InvalidInput(f"{where}: stop: a string or a list of non-empty strings, got {stop!r}")
    settings["ignore_eos"] = str(given.get("ignore_eos", False)).lower() == "true"
    if settings["max_tokens"] < 1 or settings["min_tokens"] < 0:
        raise InvalidInput(
            f"{where}: max_tokens must be at least 1 and min_tokens at least 0, got "
            f"{settings['max_tokens']} and {settings['min_tokens']}"
        )
    if not 0 <= settings["top_p"] <= 1 or settings["temperature"] < 0:
        raise InvalidInput(f"{where}: top_p must be in [0, 1] and temperature at least 0")
    return settings


def _response(text, prompt_tokens, output_tokens, logprob, finish_reason):
    return {
        "text_output": np.array([text.encode()], dtype=object),
        "finish_reason": np.array([finish_reason.encode()], dtype=object),
        "cumulative_logprob": np.array([logprob], dtype=np.float32),
        "num_input_tokens": np.array([prompt_tokens], dtype=np.uint32),
        "num_output_tokens": np.array([output_tokens], dtype=np.uint32),
    }
