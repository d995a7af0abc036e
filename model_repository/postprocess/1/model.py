"""Logits -> the top five class ids and their softmax probabilities, most likely first."""

import numpy as np

TOP = 5


class Model:
    def execute(self, inputs):
        logits = inputs["LOGITS"].astype(np.float64)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        ids = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP]
        scores = np.take_along_axis(probabilities, ids, axis=1)
        return {"CLASS_IDS": ids.astype(np.int64), "SCORES": scores.astype(np.float32)}
