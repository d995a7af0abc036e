"""Streams its text back word by word: one response per word, delay_ms apart."""

import asyncio

import numpy as np


class Model:
    def load(self, context):
        self.delay_ms = int(context.config.parameters.get("delay_ms", 20))

    async def execute(self, inputs):
        text = inputs["text_input"][0]
        delay_ms = int(inputs["delay_ms"][0]) if "delay_ms" in inputs else self.delay_ms
        words = text.split()
        for index, word in enumerate(words):
            if index:
                await asyncio.sleep(delay_ms / 1000)
            spaced = word if index == len(words) - 1 else word + b" "
            yield {
                "text_output": np.array([spaced], dtype=object),
                "index": np.array([index], dtype=np.int32),
            }
