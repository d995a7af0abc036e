"""OUTPUT0 = INPUT0, for BYTES tensors of any length."""

import numpy as np


class Model:
    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"OUTPUT0": inputs["INPUT0"]}
