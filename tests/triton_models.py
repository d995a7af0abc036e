"""Models written for Triton's python backend (a ``TritonPythonModel`` using ``pb_utils``)
and laid out as Triton lays them out (config.pbtxt beside 1/model.py), which reposerve
serves unchanged."""

from __future__ import annotations

import textwrap
from pathlib import Path

# The add/sub model the way Triton's python-backend documentation writes it.
ADD_SUB = """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.model_config = model_config = json.loads(args["model_config"])
            output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
            output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
            self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
            self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

        def execute(self, requests):
            output0_dtype = self.output0_dtype
            output1_dtype = self.output1_dtype
            responses = []
            for request in requests:
                in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
                in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
                out_0, out_1 = (
                    in_0.as_numpy() + in_1.as_numpy(),
                    in_0.as_numpy() - in_1.as_numpy(),
                )
                out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
                out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))
                inference_response = pb_utils.InferenceResponse(
                    output_tensors=[out_tensor_0, out_tensor_1]
                )
                responses.append(inference_response)
            return responses

        def finalize(self):
            print("Cleaning up...")
"""


# Triton's config.pbtxt for its add_sub example; with batching added where {batching} stands.
ADD_SUB_PBTXT = """
    name: "{name}"
    backend: "python"
    {batching}
    input [
      {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
      {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
    ]
    output [
      {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
      {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }}
    ]
    instance_group [ {{ kind: KIND_CPU }} ]
"""


def write_triton_model(root: Path, name: str, code: str, batching: str = "") -> None:
    """A model folder as Triton lays it out: add_sub's config.pbtxt (with ``batching``
    where it stands) and ``code`` as 1/model.py."""
    (root / name / "1").mkdir(parents=True)
    pbtxt = ADD_SUB_PBTXT.format(name=name, batching=batching)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(pbtxt))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))
