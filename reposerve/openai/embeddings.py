"""Embeddings: each text of a request is a request of its own to the model (a V2 request:
its text input, a batch of one, asking for the vector and the token count alone), sent
side by side, so the model's dynamic batcher joins them with each other and with other
clients' texts. The vector is the model's float output, flat; ``base64`` is its float32
bytes, little-endian, as the API sends them."""

from __future__ import annotations

import asyncio
import base64

import msgspec
import numpy as np

from reposerve.answers import Answer
from reposerve.datatypes import NUMPY_DTYPES, element_count
from reposerve.errors import ProtocolError
from reposerve.front_service import FrontService
from reposerve.operations import OpenAIModel

_encode = msgspec.json.Encoder().encode
IN_FLIGHT = 64  # a request's texts in the model's queue at once (the API allows 2048)


class Embedded(msgspec.Struct, frozen=True):
    vector: list[float] | str  # floats, or base64 of float32
    tokens: int | None  # the model's num_input_tokens, when it gives one


async def embed(
    service: FrontService, model: OpenAIModel, texts: list[str], as_base64: bool
) -> list[Embedded]:
    """Each text's vector, in order; the first failure raises (the others end). At most
    ``IN_FLIGHT`` of them wait at once, so a long list neither fills the model's queue
    nor holds a buffer per text."""
    room = asyncio.Semaphore(IN_FLIGHT)

    async def one(text: str) -> Embedded:
        async with room:
            return await _embed_one(service, model, text, as_base64)

    jobs = [asyncio.ensure_future(one(text)) for text in texts]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        for job in jobs:
            job.cancel()


async def _embed_one(
    service: FrontService, model: OpenAIModel, text: str, as_base64: bool
) -> Embedded:
    shape = [1] * model.batched + [1 if dim == -1 else dim for dim in model.input_shape]
    wanted = [{"name": model.output}]
    if "num_input_tokens" in model.outputs:
        wanted.append({"name": "num_input_tokens"})
    body = {
        "inputs": [{"name": model.input, "datatype": "BYTES", "shape": shape, "data": [text]}],
        "outputs": wanted,
    }
    with await service.infer(model.name, None, _encode(body), None) as answer:
        return _read(model, answer, as_base64)


def _read(model: OpenAIModel, answer: Answer, as_base64: bool) -> Embedded:
    vector: list[float] | str | None = None
    tokens = None
    for name, tensor in answer.tensors:
        values = np.frombuffer(
            tensor.memory(), NUMPY_DTYPES[tensor.datatype], element_count(tensor.shape)
        )
        if name == model.output:
            if tensor.datatype == "BF16":
                values = (values.astype(np.uint32) << 16).view(np.float32)
            floats = values.astype("<f4")
            if not np.isfinite(floats).all():
                raise ProtocolError(
                    f"model '{model.name}': output '{name}' holds a NaN or infinity, which an "
                    "embedding cannot carry"
                )
            vector = base64.b64encode(floats.tobytes()).decode() if as_base64 else floats.tolist()
        elif name == "num_input_tokens" and tensor.datatype != "BYTES":
            tokens = int(values.sum())
    if vector is None:
        raise ProtocolError(f"model '{model.name}' left its output '{model.output}' out")
    return Embedded(vector, tokens)
