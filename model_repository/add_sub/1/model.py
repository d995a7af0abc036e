"""OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, for a batch of INT32[16] vectors."""

import numpy as np


class Model:
    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        a, b = inputs["INPUT0"], inputs["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}
