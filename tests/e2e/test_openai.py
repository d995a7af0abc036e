"""The OpenAI-compatible routes, with the ``openai`` SDK unchanged (sync and async, stream
and not): the bundled chat generator and embedding model, a Triton vLLM-style python model
from config.pbtxt with a Hugging Face tokenizer_config.json template, stop strings cut
across responses, a cancelled stream, errors in the API's shape, batching of embeddings,
API keys, the /openai/v1 prefix and front workers; seeds at the edge of int64; tiny_chat
as vLLM-shaped clients call it (genai-perf's rows, the generate extension); and vLLM's
GET /health."""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from tests.server import (
    REPO_ROOT,
    Server,
    front_calls,
    pinned_clients,
    running_server,
    start_server,
)
from tests.toy_models import TEXT_IN_OUT, vector_config, write_model

pytestmark = pytest.mark.e2e

# Triton's vLLM backend's interface, from a TritonPythonModel that declares its tensors in
# auto_complete_config as vLLM's model.py does: it logs what it was sent.
VLLM_STYLE = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            switches = ["stream", "exclude_input_in_output", "return_num_input_tokens",
                        "return_num_output_tokens"]
            inputs = [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
                      {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1],
                       "optional": True}]
            inputs += [{"name": name, "data_type": "TYPE_BOOL", "dims": [1], "optional": True}
                       for name in switches]
            outputs = [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
                       {"name": "num_input_tokens", "data_type": "TYPE_UINT32", "dims": [1]},
                       {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]}]
            for tensor in inputs:
                config.add_input(tensor)
            for tensor in outputs:
                config.add_output(tensor)
            config.set_model_transaction_policy(dict(decoupled=True))
            config.set_max_batch_size(0)
            return config

        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.log = config["parameters"]["log"]["string_value"]

        def execute(self, requests):
            for request in requests:
                def value(name, default):
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    return default if tensor is None else tensor.as_numpy()[0]
                prompt = value("text_input", b"").decode()
                sampling = json.loads(value("sampling_parameters", b"{}"))
                stream = bool(value("stream", False))
                with open(self.log, "a") as log:
                    log.write(json.dumps({
                        "prompt": prompt, "sampling": sampling, "stream": stream,
                        "exclude_input_in_output": bool(value("exclude_input_in_output", False)),
                    }) + "\\n")
                words = [f" w{i}" for i in range(sampling.get("max_tokens", 16))]
                sender = request.get_response_sender()
                prompt_tokens = np.array([len(prompt.split())], np.uint32)
                pieces = words if stream else ["".join(words)]
                for piece in pieces:
                    sender.send(pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("text_output", np.array([piece.encode()], object)),
                        pb_utils.Tensor("num_input_tokens", prompt_tokens),
                        pb_utils.Tensor("num_output_tokens",
                                        np.array([len(piece.split())], np.uint32)),
                    ]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

VLLM_CONFIG = """
    backend: "python"
    parameters { key: "log" value: { string_value: "LOG" } }
    parameters { key: "reposerve.openai.kind" value: { string_value: "chat" } }
"""

TOKENIZER_CONFIG = {
    "bos_token": {"content": "<s>", "lstrip": False},
    "eos_token": "</s>",
    "chat_template": [
        {"name": "tool_use", "template": "unused"},
        {
            "name": "default",
            "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n"
            "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
        },
    ],
}

# Streams the words of its prompt, its delay apart, logging its start and a cancellation.
SLOW_WORDS = """
    import asyncio
    from pathlib import Path
    import numpy as np

    class Model:
        def load(self, context):
            self.log = Path(context.config.parameters["log"])
            self.delay = float(context.config.parameters["delay"])

        async def execute(self, inputs):
            text = inputs["text_input"][0].decode()
            with self.log.open("a") as log:
                log.write("started\\n")
            if text == "fail":
                raise ValueError("this model refuses the prompt 'fail'")
            if text == "split":  # one character in two responses, as byte tokens come
                for part in ("é".encode()[:1], "é".encode()[1:]):
                    yield {"text_output": np.array([part], dtype=object)}
                return
            try:
                for word in text.split():
                    await asyncio.sleep(self.delay)
                    yield {"text_output": np.array([word.encode() + b" "], dtype=object)}
            except (asyncio.CancelledError, GeneratorExit):
                with self.log.open("a") as log:
                    log.write("cancelled\\n")
                raise
"""


# Answers the seed it was given, in its INT64 "seed" input (as a TensorRT-LLM-style model
# takes one).
SEED_ECHO = """
    import numpy as np

    class Model:
        def execute(self, inputs):
            return {"text_output": np.array([str(int(inputs["seed"][0])).encode()], object)}
"""

SEED_ECHO_CONFIG = f"""
    backend = "python"
    {TEXT_IN_OUT}
    [[input]]
    name = "seed"
    datatype = "INT64"
    shape = [1]
    optional = true
    [openai]
    kind = "completion"
"""


def slow_words_config(log: Path) -> str:
    return (
        f'backend = "python"\ndecoupled = true\n{TEXT_IN_OUT}[parameters]\nlog = "{log}"\n'
        'delay = 0.02\n[openai]\nkind = "completion"\nmax_tokens = 1000\n'
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """A server with the bundled tiny_chat and text_embedding, the vLLM-style model,
    slow_words, and a model not on the routes; and the logs of the test models."""
    root = tmp_path_factory.mktemp("openai")
    repository = root / "repository"
    for name in ("tiny_chat", "text_embedding", "add_sub"):
        shutil.copytree(REPO_ROOT / "model_repository" / name, repository / name)
    logs = {"vllm": root / "vllm.log", "slow": root / "slow.log"}
    vllm = repository / "vllm_style"
    (vllm / "1").mkdir(parents=True)
    (vllm / "config.pbtxt").write_text(
        textwrap.dedent(VLLM_CONFIG).replace("LOG", str(logs["vllm"]))
    )
    (vllm / "1" / "model.py").write_text(textwrap.dedent(VLLM_STYLE))
    (vllm / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    write_model(repository, "slow_words", slow_words_config(logs["slow"]), SLOW_WORDS)
    write_model(repository, "seed_echo", SEED_ECHO_CONFIG, SEED_ECHO)
    server = start_server(repository, root)
    yield server, logs
    assert server.stop() == 0, server.log()


def _client(server, prefix: str = "/v1", **options) -> openai.OpenAI:
    options.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=server.url + prefix, api_key="unused", **options)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_model_list_names_the_models_that_opt_in(served):
    server, _ = served
    for prefix in ("/v1", "/openai/v1"):
        listed = {model.id for model in _client(server, prefix).models.list()}
        assert listed == {"tiny_chat", "text_embedding", "vllm_style", "slow_words", "seed_echo"}
    model = _client(server).models.retrieve("tiny_chat")
    assert model.id == "tiny_chat" and model.owned_by == "reposerve" and model.created > 0


def test_chat_with_the_bundled_generator_stream_and_not(served):
    server, _ = served
    client = _client(server)
    question = [{"role": "user", "content": "How are requests batched?"}]
    whole = client.chat.completions.create(
        model="tiny_chat", messages=question, max_tokens=6, seed=7, temperature=0.8
    )
    (choice,) = whole.choices
    assert whole.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content.strip() and choice.finish_reason in ("stop", "length")
    # the model's own count of the rendered prompt's words: the question's 4, "user" and
    # "assistant" of the template's markers
    assert whole.usage.prompt_tokens == 6
    assert whole.usage.completion_tokens == len(choice.message.content.split())
    stream = client.chat.completions.create(
        model="tiny_chat",
        messages=question,
        max_tokens=6,
        seed=7,
        temperature=0.8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # the same seed draws the same words
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == choice.finish_reason and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_max_tokens_ends_the_text_with_length(served):
    server, _ = served
    answer = _client(server).chat.completions.create(
        model="tiny_chat",
        messages=[{"role": "user", "content": [{"type": "text", "text": "the scheduler"}]}],
        max_completion_tokens=3,
        temperature=0.001,  # as good as 0: the likeliest words, with no overflow
        seed=-5,  # the API's seeds may be negative
    )
    assert answer.choices[0].finish_reason == "length"
    assert len(answer.choices[0].message.content.split()) == 3


def test_n_choices_are_drawn_apart_and_counted_once_for_the_prompt(served):
    server, _ = served
    answer = _client(server).chat.completions.create(
        model="tiny_chat",
        messages=[{"role": "user", "content": "What does a model server do?"}],
        max_tokens=10,
        n=3,
        seed=1,
    )
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert answer.usage.prompt_tokens == 6 + 2  # once, not once per choice
    completion = sum(len(choice.message.content.split()) for choice in answer.choices)
    assert answer.usage.completion_tokens == completion


def test_choices_of_a_seed_at_the_int64_maximum_wrap_around(served):
    """Each choice's seed is the request's plus its index: past the API's largest seed it
    wraps to the smallest, a value the model's INT64 seed input holds."""
    server, _ = served
    client = _client(server)
    largest = (1 << 63) - 1
    answer = client.completions.create(model="seed_echo", prompt="a", n=3, seed=largest - 1)
    assert [choice.text for choice in answer.choices] == [
        str(largest - 1),
        str(largest),
        str(-(1 << 63)),
    ]
    # past the API's range (OpenAI's and vLLM's: int64): refused, naming the field
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="seed_echo", prompt="a", seed=largest + 1)
    assert caught.value.body["param"] == "seed"


def test_streamed_choices_each_finish_and_the_usage_comes_last(served):
    server, _ = served
    chunks = list(
        _client(server).chat.completions.create(
            model="tiny_chat",
            messages=[{"role": "user", "content": "What does a model server do?"}],
            max_tokens=4,
            n=2,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices}
    assert set(finishes) == {0, 1} and all(finishes.values())
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant", "assistant"]
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        texts[chunk.choices[0].index] += chunk.choices[0].delta.content or ""
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens == 8
    assert usage.completion_tokens == sum(len(text.split()) for text in texts.values())


# genai-perf's rows for a Triton vLLM model (its VLLMConverter): sampling_parameters with
# max_tokens as a string, exclude_input_in_output true, stream only with --streaming.
GENAI_PERF_ROWS = [
    {"text_input": "How does the scheduler form a batch?", "stream": stream,
     "sampling_parameters": json.dumps({"max_tokens": "8", "min_tokens": "8"}),
     "exclude_input_in_output": True}
    for stream in (False, True, False, True)
]  # fmt: skip


def _grpc_inputs(row: dict) -> list:
    inputs = []
    for name, value in row.items():
        is_text = isinstance(value, str)
        tensor = grpcclient.InferInput(name, [1], "BYTES" if is_text else "BOOL")
        tensor.set_data_from_numpy(
            np.array([value.encode() if is_text else value], object if is_text else bool)
        )
        inputs.append(tensor)
    return inputs


def test_tiny_chat_answers_genai_perfs_vllm_requests_as_vllm_does(served):
    """Over a gRPC stream, as perf_analyzer sends what genai-perf writes: one response
    with the whole text unless streaming, the prompt left out, min_tokens kept."""
    server, _ = served
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for index, row in enumerate(GENAI_PERF_ROWS):
            client.async_stream_infer(
                "tiny_chat", _grpc_inputs(row), request_id=str(index),
                enable_empty_final_response=True,
            )  # fmt: skip
        received: dict[str, list] = {str(index): [] for index in range(len(GENAI_PERF_ROWS))}
        finals = 0
        while finals < len(GENAI_PERF_ROWS):  # each request sent ends in one final answer
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
            if result.as_numpy("text_output") is not None:
                received[response.id].append(result)
    finally:
        client.stop_stream()
    for index, row in enumerate(GENAI_PERF_ROWS):
        results = received[str(index)]
        texts = [result.as_numpy("text_output")[0].decode() for result in results]
        counted = sum(int(result.as_numpy("num_output_tokens")[0]) for result in results)
        text = "".join(texts)
        assert len(text.split()) == counted == 8  # min_tokens = max_tokens: exactly 8 words
        assert not text.strip().startswith("How does")  # exclude_input_in_output
        assert len(results) == (9 if row["stream"] else 1)  # a word each, then the end
        assert results[-1].as_numpy("finish_reason")[0] == b"length"


def test_tiny_chat_on_the_generate_extension_as_vllms_model(served):
    """Triton's generate extension as its vLLM guide calls it: vLLM's defaults (the prompt
    first, 16 tokens at most, one response), settings in sampling_parameters."""
    server, _ = served
    url = f"{server.url}/v2/models/tiny_chat/generate"
    prompt = "What is a model server?"
    plain = httpx.post(url, json={"text_input": prompt}, timeout=30)
    assert plain.status_code == 200, plain.text
    text = plain.json()["text_output"]
    assert text.startswith(prompt) and 1 <= len(text[len(prompt) :].split()) <= 16
    sampled = httpx.post(url, json={
        "text_input": prompt, "exclude_input_in_output": True,
        "sampling_parameters": json.dumps({"max_tokens": 5, "temperature": 0, "stop": ["."]}),
    }, timeout=30)  # fmt: skip
    assert sampled.status_code == 200, sampled.text
    answer = sampled.json()
    assert not answer["text_output"].startswith(prompt) and answer["text_output"].strip()
    assert "." not in answer["text_output"] and answer["finish_reason"] in ("stop", "length")
    echoed = {"text_input": prompt, "stream": True, "exclude_input_in_output": False}
    streamed = httpx.post(url + "_stream", json=echoed, timeout=30)
    assert "exclude_input_in_output" in streamed.text  # vLLM's rule, named


def test_tiny_chat_never_answers_an_empty_completion(served):
    """A prompt whose last word ends a sentence in the corpus: the first draw ends the
    text, so a new sentence begins instead."""
    server, _ = served
    answer = _client(server).completions.create(
        model="tiny_chat", prompt="without copies that serve no purpose.", max_tokens=4, n=6, seed=0
    )
    assert all(choice.text.strip() for choice in answer.choices), answer.choices


def test_nulls_the_api_allows_read_as_absent(served):
    server, _ = served
    reply = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": "tiny_chat", "prompt": "a", "n": None, "stream": None, "echo": None,
              "stream_options": {"include_usage": None}, "max_tokens": 2},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"]) == 1
    embedded = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": "text_embedding", "input": "a", "encoding_format": None},
    )
    assert isinstance(embedded.json()["data"][0]["embedding"], list)


def test_a_vllm_style_model_gets_its_sampling_parameters_and_template(served):
    """A Triton vLLM-backend-shaped TritonPythonModel from config.pbtxt serves unchanged:
    its sampling_parameters hold the request's settings, its prompt is the
    tokenizer_config.json template's (bos_token included), exclude_input_in_output is set."""
    server, logs = served
    client = _client(server)
    answer = client.chat.completions.create(
        model="vllm_style",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
        max_tokens=4,
        temperature=0.5,
        top_p=0.9,
        stop=["w9"],
        seed=11,
    )
    assert answer.choices[0].message.content == " w0 w1 w2 w3"
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == 4
    sent = json.loads(_lines(logs["vllm"])[-1])
    assert sent["prompt"] == "<s>[system] be brief\n[user] hello there\n[assistant]"
    assert sent["sampling"] == {
        "max_tokens": 4, "temperature": 0.5, "top_p": 0.9, "seed": 11, "stop": ["w9"],
    }  # fmt: skip
    assert sent["stream"] is False and sent["exclude_input_in_output"] is True
    streamed = client.completions.create(
        model="vllm_style", prompt="one two three", max_tokens=3, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == " w0 w1 w2"
    assert json.loads(_lines(logs["vllm"])[-1])["stream"] is True


def test_stop_strings_cut_the_text_across_responses(served):
    """slow_words answers one word per response; a stop string that spans two of them
    still cuts the text before it, and the generation ends there."""
    server, logs = served
    client = _client(server)
    prompt = "alpha beta STOP gamma delta"
    answer = client.completions.create(model="slow_words", prompt=prompt, stop="a ST")
    assert answer.choices[0].text == "alpha bet"
    assert answer.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(model="slow_words", prompt=prompt, stop=["P g"], stream=True)
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == "alpha beta STO"
    assert chunks[-1].choices[0].finish_reason == "stop"
    split = client.completions.create(model="slow_words", prompt="split")
    assert split.choices[0].text == "é"  # joined across responses, not two broken halves
    echoed = client.completions.create(model="slow_words", prompt="x y", echo=True)
    assert echoed.choices[0].text == "x y" + "x y "


def test_a_cancelled_stream_ends_the_generation_in_the_instance(served):
    server, logs = served
    words = " ".join(f"word{i}" for i in range(200))
    stream = _client(server).completions.create(model="slow_words", prompt=words, stream=True)
    cancelled = _lines(logs["slow"]).count("cancelled")
    received = [next(iter(stream)) for _ in range(3)]
    assert received[0].choices[0].text == "word0 "
    stream.close()
    assert _wait_for(lambda: _lines(logs["slow"]).count("cancelled") == cancelled + 1)


def test_an_async_client_streams_chats_side_by_side(served):
    server, _ = served

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        async with client:

            async def one(seed: int) -> str:
                stream = await client.chat.completions.create(
                    model="tiny_chat",
                    messages=[{"role": "user", "content": "tell me about batches"}],
                    max_tokens=5,
                    seed=seed,
                    stream=True,
                )
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            texts = await asyncio.gather(*(one(seed) for seed in range(8)))
            whole = await client.completions.create(
                model="tiny_chat", prompt="the server", max_tokens=5, seed=0
            )
            assert whole.object == "text_completion"
            return [*texts, whole.choices[0].text]

    texts = asyncio.run(main())
    assert all(text.strip() for text in texts)
    assert len(set(texts[:8])) > 1  # the seeds draw different words


def test_embeddings_float_and_base64_and_batched_under_concurrency(served):
    server, _ = served
    client = _client(server)
    texts = ["the scheduler forms batches", "batches are formed by the scheduler", "zebra"]
    as_floats = client.embeddings.create(
        model="text_embedding", input=texts, encoding_format="float"
    )
    vectors = np.array([item.embedding for item in as_floats.data])
    assert vectors.shape == (3, 256)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]  # shared words point alike
    assert as_floats.usage.prompt_tokens == 4 + 6 + 1
    as_base64 = client.embeddings.create(model="text_embedding", input=texts)  # SDK's default
    assert np.allclose([item.embedding for item in as_base64.data], vectors, atol=1e-6)
    single = client.embeddings.create(model="text_embedding", input="zebra")
    assert np.allclose(single.data[0].embedding, vectors[2], atol=1e-6)

    stats_url = f"{server.url}/v2/models/text_embedding/stats"
    before = httpx.get(stats_url).json()["model_stats"][0]

    async def burst() -> None:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0
        ) as aclient:
            await asyncio.gather(
                *(
                    aclient.embeddings.create(model="text_embedding", input=[f"text {i}"] * 4)
                    for i in range(32)
                )
            )

    asyncio.run(burst())
    after = httpx.get(stats_url).json()["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 128
    assert executions < inferences / 2, (executions, inferences)  # batches well past one


def test_errors_come_in_the_apis_shape(served):
    server, _ = served
    client = _client(server)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as not_on_routes:
        client.embeddings.create(model="add_sub", input="x")
    assert "[openai]" in not_on_routes.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="tiny_chat", messages=[{"role": "user", "content": "x"}], max_tokens=0
        )
    assert bad.value.param == "max_tokens" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as wrong_kind:
        client.chat.completions.create(
            model="text_embedding", messages=[{"role": "user", "content": "x"}]
        )
    assert wrong_kind.value.param == "model" and "embedding model" in wrong_kind.value.message
    with pytest.raises(openai.BadRequestError) as image:
        client.chat.completions.create(
            model="tiny_chat",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
        )
    assert image.value.param == "messages[0].content"
    with pytest.raises(openai.BadRequestError) as logprobs:
        client.chat.completions.create(
            model="tiny_chat", messages=[{"role": "user", "content": "x"}], logprobs=True
        )
    assert logprobs.value.param == "logprobs"
    with pytest.raises(openai.BadRequestError) as fan_out:
        client.completions.create(model="tiny_chat", prompt=["x"] * 9, n=8)
    assert fan_out.value.param == "prompt" and "72 generations" in fan_out.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.models.retrieve("nope")
    assert unknown.value.code == "model_not_found"
    raw = httpx.post(f"{server.url}/v1/embeddings", content=b"{not json")
    assert raw.status_code == 400 and raw.headers["x-should-retry"] == "false"
    assert raw.json()["error"]["type"] == "invalid_request_error"


def test_a_model_failure_is_a_500_the_sdk_does_not_retry(served):
    """x-should-retry: false keeps the SDK (which retries 5xx) from running the model
    again; the failure's message names the model's error."""
    server, logs = served
    started = len(_lines(logs["slow"]))
    client = _client(server, max_retries=3)
    with pytest.raises(openai.InternalServerError) as failed:
        client.completions.create(model="slow_words", prompt="fail")
    assert "this model refuses the prompt 'fail'" in failed.value.message
    assert failed.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.InternalServerError):
        list(client.completions.create(model="slow_words", prompt="fail", stream=True))
    assert _lines(logs["slow"])[started:] == ["started", "started"]  # once each: no retry


def test_the_routes_count_in_the_models_statistics(served):
    server, _ = served
    url = f"{server.url}/v2/models/tiny_chat/stats"

    def successes() -> int:
        return httpx.get(url).json()["model_stats"][0]["inference_stats"]["success"]["count"]

    before = successes()
    _client(server).completions.create(model="tiny_chat", prompt="a model", max_tokens=2)
    # a stream is counted once its last response is in, a moment after the answer
    assert _wait_for(lambda: successes() == before + 1), (before, successes())


def test_api_keys_guard_the_routes_alone(tmp_path):
    repository = tmp_path / "repository"
    for name in ("text_embedding", "add_sub"):
        shutil.copytree(REPO_ROOT / "model_repository" / name, repository / name)
    with running_server(
        repository, tmp_path, "--openai-api-key", "key-one", "--openai-api-key", "key-two"
    ) as server:
        for key in ("key-one", "key-two"):
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
            assert client.embeddings.create(model="text_embedding", input="x").data
        wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.models.list()
        assert refused.value.code == "invalid_api_key"
        bare = httpx.get(f"{server.url}/openai/v1/models")
        assert bare.status_code == 401 and "Authorization: Bearer" in bare.text
        # the V2 routes keep their own rules: no key needed
        infer = httpx.post(
            f"{server.url}/v2/models/add_sub/infer",
            json={
                "inputs": [
                    {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                    for name in ("INPUT0", "INPUT1")
                ]
            },
        )
        assert infer.status_code == 200, infer.text


def test_both_front_workers_serve_the_routes(tmp_path):
    """Front 1 (another process) serves the routes through the core as front 0 does."""
    repository = tmp_path / "repository"
    for name in ("tiny_chat", "text_embedding"):
        shutil.copytree(REPO_ROOT / "model_repository" / name, repository / name)
    with running_server(repository, tmp_path, "--http-workers", "2") as server:
        pinned = pinned_clients(server)
        for front, connection in pinned.items():
            client = openai.OpenAI(
                base_url=server.url + "/v1", api_key="unused", http_client=connection,
                max_retries=0,
            )  # fmt: skip
            before = front_calls(server)
            answer = client.chat.completions.create(
                model="tiny_chat", messages=[{"role": "user", "content": "hello"}], max_tokens=3
            )
            assert answer.choices[0].finish_reason in ("stop", "length")
            assert len(client.embeddings.create(model="text_embedding", input="a").data) == 1
            assert {m.id for m in client.models.list()} == {"tiny_chat", "text_embedding"}
            assert (front_calls(server) > before) == (front == 1)
            # last: the SDK lets go of a stream's connection at [DONE]
            chunks = list(
                client.chat.completions.create(
                    model="tiny_chat",
                    messages=[{"role": "user", "content": "hello"}],
                    max_tokens=3,
                    stream=True,
                )
            )
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")
            connection.close()


# Its load waits for the file its parameter names: the server is up, not yet ready.
GATED = """
    import time
    from pathlib import Path

    class Model:
        def load(self, context):
            gate = Path(context.config.parameters["gate"])
            deadline = time.monotonic() + 120  # a hang detector, not a timing
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

        def execute(self, inputs):
            return {"OUTPUT": inputs["INPUT"]}
"""


def test_health_answers_as_vllms_on_every_front(tmp_path):
    """GET /health, which guidellm and other OpenAI-world tools probe first: 503 while the
    server loads its models, then 200 with an empty body, from each front worker."""
    gate = tmp_path / "gate"
    config = vector_config(max_batch=0, extra=f'[parameters]\ngate = "{gate}"')
    write_model(tmp_path / "repository", "gated", config, GATED)
    server = Server(tmp_path / "repository", "--http-workers", "2", log_path=tmp_path / "log")
    try:
        assert _wait_for(lambda: _status(server.url + "/v2/health/live") == 200, 60)
        pinned = pinned_clients(server)
        for connection in pinned.values():
            loading = connection.get("/health")
            assert (loading.status_code, loading.content) == (503, b"")
        gate.touch()
        server.wait_ready()
        for front, connection in pinned.items():
            before = front_calls(server)
            healthy = connection.get("/health")
            assert (healthy.status_code, healthy.content) == (200, b"")
            assert (front_calls(server) > before) == (front == 1)  # each front answered
            connection.close()
    finally:
        assert server.stop() == 0, server.log()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return None
