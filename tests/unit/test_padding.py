"""Variable-length batching as pure logic: the config's rules, batch keys, bucket choice,
nearest lengths first, the padded inputs with their lengths, and outputs cut back."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from reposerve.config import parse_model_config
from reposerve.config.pbtxt import parse_pbtxt
from reposerve.config.sequences import client_facing, model_facing
from reposerve.config.triton import to_triton
from reposerve.config.triton_json import parse_triton_config
from reposerve.datatypes import to_numpy
from reposerve.errors import ConfigError
from reposerve.instance.outcomes import PartUnreadable
from reposerve.protocol.request import InferRequest
from reposerve.scheduler.padding import PaddedBatch, Padding
from reposerve.tensor import FileWindow, Tensor

pytestmark = pytest.mark.unit

BASE = """
max_batch_size = 8
[[input]]
name = "IDS"
datatype = "INT64"
shape = [-1]
[[input]]
name = "MASK"
datatype = "FP32"
shape = [-1]
[[input]]
name = "FIXED"
datatype = "FP32"
shape = [2]
[[output]]
name = "HIDDEN"
datatype = "FP32"
shape = [-1, 3]
[dynamic_batching]
pad = { IDS = 0, MASK = 0.0 }
"""


def _config(extra: str = "", base: str = BASE):
    return parse_model_config(base + extra, "m/config.toml")


def _error(extra: str, base: str = BASE) -> str:
    with pytest.raises(ConfigError) as caught:
        _config(extra, base)
    return str(caught.value)


def _request(
    length: int, rows: int = 1, start: int = 1, mask_length: int | None = None
) -> InferRequest:
    ids = np.arange(start, start + rows * length, dtype=np.int64).reshape(rows, length)
    mask = np.ones((rows, length if mask_length is None else mask_length), np.float32)
    fixed = np.full((rows, 2), 7.0, np.float32)
    inputs = {
        name: Tensor(datatype, array.shape, memoryview(array).cast("B"))
        for name, datatype, array in (("IDS", "INT64", ids), ("MASK", "FP32", mask))
    } | {"FIXED": Tensor("FP32", fixed.shape, memoryview(fixed).cast("B"))}
    return InferRequest(None, inputs, rows, None, True, 0, 0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("buckets = [8]\n", ""),  # fine
        ('lengths_input = "IDS"\n', '"IDS" is declared in [[input]]'),
        ("buckets = [64, 32]\n", "increasing order, once each"),
        ('unpad = { NOPE = "IDS" }\n', '"NOPE" is not a declared output'),
        ('unpad = { HIDDEN = "FIXED" }\n', '"FIXED" is not a padded input'),
    ],
)
def test_the_padding_rules(extra, message):
    if not message:
        assert _config(extra).dynamic_batching.buckets == [8]
    else:
        assert message in _error(extra)


def test_a_padded_input_needs_a_variable_numeric_dim():
    assert 'input "FIXED" has no -1 dim to pad' in _error(
        "", BASE.replace("MASK = 0.0", "FIXED = 0")
    )
    text = BASE.replace('name = "MASK"\ndatatype = "FP32"', 'name = "MASK"\ndatatype = "BYTES"')
    assert 'input "MASK" is BYTES: only numeric inputs are padded' in _error("", text)
    unpadded = BASE.replace("pad = { IDS = 0, MASK = 0.0 }", "buckets = [8]")
    assert "dynamic_batching.buckets: needs dynamic_batching.pad" in _error("", unpadded)


def test_the_lengths_input_is_the_models_and_never_a_clients():
    config = _config('lengths_input = "LENGTHS"\nlengths_datatype = "INT64"\n')
    facing = model_facing(config)
    assert [(t.name, t.datatype, t.shape) for t in facing.input][-1] == ("LENGTHS", "INT64", [1])
    assert [t.name for t in client_facing(facing, config).input] == ["IDS", "MASK", "FIXED"]


def test_config_pbtxt_and_triton_json_carry_the_settings_in_parameters():
    config = _config('buckets = [16, 32]\nlengths_input = "LENGTHS"\nunpad = { HIDDEN = "IDS" }\n')
    again = parse_triton_config(json.dumps(to_triton("m", "python", config)), "m")
    assert again.dynamic_batching == config.dynamic_batching
    pbtxt = """
        max_batch_size: 8
        input [{ name: "IDS" data_type: TYPE_INT64 dims: [-1] }]
        output [{ name: "OUT" data_type: TYPE_FP32 dims: [-1] }]
        dynamic_batching { max_queue_delay_microseconds: 100 }
        parameters [
          { key: "reposerve.dynamic_batching.pad" value: { string_value: "{\\"IDS\\": 0}" } },
          { key: "reposerve.dynamic_batching.buckets" value: { string_value: "[64, 128]" } }
        ]
    """
    batching = parse_pbtxt(pbtxt, "m/config.pbtxt").dynamic_batching
    assert (batching.pad, batching.buckets, batching.max_queue_delay_microseconds) == (
        {"IDS": 0},
        [64, 128],
        100,
    )


def test_keys_leave_out_padded_dims_and_hold_the_bucket():
    plain = Padding(_config())
    assert plain.key(_request(3)) == plain.key(_request(30))
    bucketed = Padding(_config("buckets = [4, 8]\n"))
    assert bucketed.key(_request(1)) == bucketed.key(_request(4))
    assert bucketed.key(_request(4)) != bucketed.key(_request(5))
    assert bucketed.key(_request(5)) == bucketed.key(_request(8))
    # past the largest bucket: a key of its own, even beside one of its own length
    assert bucketed.key(_request(9)) != bucketed.key(_request(9))


def test_the_target_is_the_longest_or_its_bucket():
    assert Padding(_config()).target([3, 9, 4]) == 9
    bucketed = Padding(_config("buckets = [4, 8, 16]\n"))
    assert [bucketed.target([n]) for n in (1, 4, 5, 16, 17)] == [4, 4, 8, 16, 17]


def test_the_nearest_lengths_join_first_the_oldest_among_equals():
    bucketed = Padding(_config("buckets = [256]\n"))
    lengths = [10, 50, 11, 9, 10, 200]
    sizes = [(n, n) for n in lengths]
    assert bucketed.closest(sizes[0], sizes) == [0, 4, 2, 3, 1, 5]
    # without buckets, none joins that is more than twice as long as another
    assert Padding(_config()).closest(sizes[0], sizes) == [0, 4, 2, 3]
    sizes = [(n, n) for n in (6, 12, 13, 3, 4)]
    assert Padding(_config()).closest(sizes[0], sizes) == [0, 4, 3]
    # along every padded dim: a mask of another length may not double the batch either
    lying = [(5, 5), (6, 6), (5, 100000)]
    assert Padding(_config()).closest(lying[0], lying) == [0, 1]


def test_a_dim_past_the_largest_bucket_runs_alone_whichever_input_has_it():
    bucketed = Padding(_config("buckets = [4, 8]\n"))
    for request in (_request(9), _request(3, mask_length=100)):
        assert bucketed.alone(bucketed.key(request))
    assert not bucketed.alone(bucketed.key(_request(3, mask_length=8)))
    assert bucketed.key(_request(3, mask_length=8)) != bucketed.key(_request(3))


@pytest.mark.parametrize(
    ("pad", "message"),
    [
        ("pad = { IDS = 0.5, MASK = 0 }", 'input "IDS" is INT64: its pad value 0.5 is not'),
        ("pad = { IDS = 0, MASK = 1e39 }", 'input "MASK" is FP32: its pad value 1e+39 is not'),
    ],
)
def test_a_pad_value_is_one_of_its_inputs_values(pad, message):
    assert message in _error("", BASE.replace("pad = { IDS = 0, MASK = 0.0 }", pad))


def test_no_padding_with_preserve_ordering():
    assert "not with preserve_ordering" in _error("preserve_ordering = true\n")


def test_padded_inputs_with_their_lengths_and_the_padding_counted():
    padding = Padding(_config('buckets = [4, 8]\nlengths_input = "LENGTHS"\n'))
    requests = [_request(2, start=1), _request(3, rows=2, start=10)]
    counted = PaddedBatch()
    tensors = {t.name: t for t in padding.inputs(requests, 3, counted)}
    ids = tensors["IDS"]
    assert ids.shape == (3, 4)
    joined = b"".join(bytes(part) for part in ids.parts)
    assert to_numpy("INT64", ids.shape, joined).tolist() == [
        [1, 2, 0, 0],
        [10, 11, 12, 0],
        [13, 14, 15, 0],
    ]
    assert tensors["FIXED"].shape == (3, 2)  # not padded, carried as sent
    lengths = tensors["LENGTHS"]
    assert (lengths.datatype, lengths.shape) == ("INT32", (3, 1))
    joined = b"".join(bytes(part) for part in lengths.parts)
    assert to_numpy("INT32", (3, 1), joined)[:, 0].tolist() == [2, 3, 3]
    # IDS and MASK: 12 elements each, of which 2 + 2 are padding
    assert (counted.elements, counted.padding) == (24, 8)


def test_outputs_are_cut_back_to_their_requests_length():
    padding = Padding(_config('unpad = { HIDDEN = "IDS" }\n'))
    hidden = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    output = Tensor("FP32", hidden.shape, memoryview(hidden).cast("B"))
    cut = padding.cut(_request(3, rows=2), {"HIDDEN": output, "OTHER": output})
    assert cut["HIDDEN"].shape == (2, 3, 3)
    got = to_numpy("FP32", cut["HIDDEN"].shape, cut["HIDDEN"].raw)
    np.testing.assert_array_equal(got, hidden[:, :3])
    assert cut["OTHER"] is output  # not listed in unpad: as the model gave it
    assert padding.cut(_request(5, rows=2), {"HIDDEN": output})["HIDDEN"] is output


GRID = """
max_batch_size = 8
[[input]]
name = "GRID"
datatype = "FP32"
shape = [-1, -1]
[[output]]
name = "DOUBLED"
datatype = "FP32"
shape = [-1, -1]
[[output]]
name = "SEQUENCES"
datatype = "FP32"
shape = [-1, -1, -1]
[dynamic_batching]
pad = { GRID = 0 }
buckets = [4, 8]
unpad = { DOUBLED = "GRID", SEQUENCES = "GRID" }
"""


def test_outputs_are_cut_back_along_every_padded_dim():
    padding = Padding(_config(base=GRID))
    grid = np.ones((1, 3, 5), np.float32)
    request = InferRequest(
        None, {"GRID": Tensor("FP32", grid.shape, memoryview(grid).cast("B"))}, 1, None, True, 0, 0
    )
    doubled = np.arange(4 * 8, dtype=np.float32).reshape(1, 4, 8)
    sequences = np.arange(4 * 8 * 6, dtype=np.float32).reshape(1, 4, 8, 6)
    cut = padding.cut(
        request,
        {
            "DOUBLED": Tensor("FP32", doubled.shape, memoryview(doubled).cast("B")),
            "SEQUENCES": Tensor("FP32", sequences.shape, memoryview(sequences).cast("B")),
        },
    )
    got = to_numpy("FP32", cut["DOUBLED"].shape, cut["DOUBLED"].raw)
    np.testing.assert_array_equal(got, doubled[:, :3, :5])  # 3x5, not 3x8
    # a -1 dim past the input's is the model's own: left as it is
    got = to_numpy("FP32", cut["SEQUENCES"].shape, cut["SEQUENCES"].raw)
    np.testing.assert_array_equal(got, sequences[:, :3, :5, :])


def test_a_batch_padded_to_the_largest_bucket_must_fit_the_ceiling():
    grid = GRID.replace("buckets = [4, 8]", "buckets = [8, 16384]")
    assert _error("", grid) == (
        "m/config.toml: dynamic_batching.buckets: a batch of 8 padded to the largest (16384) "
        'along every -1 dim of input "GRID" FP32 [-1, -1] takes 8589934592 bytes, past the '
        "2147483647 a padded batch may take. Hint: make the largest bucket smaller; a request "
        "longer than it runs alone, unpadded"
    )
    # both padded inputs count: 8 rows of 2**24 INT64 and FP32 elements (1.5 GiB) fit,
    # of 2**25 (3 GiB) do not
    assert _config("buckets = [16777216]\n").dynamic_batching.buckets == [16777216]
    assert "takes 3221225472 bytes" in _error("buckets = [33554432]\n")


def test_a_shared_memory_input_cut_short_fails_its_request_alone(tmp_path):
    padding = Padding(_config())
    region = tmp_path / "region"
    region.write_bytes(np.arange(3, dtype=np.int64).tobytes())
    with open(region, "rb") as file:
        short = _request(3, start=1)
        window = FileWindow(file.fileno(), 0, 3 * 8, "region 'r'")
        short.inputs["IDS"] = Tensor("INT64", (1, 3), window)
        os.truncate(region, 8)  # the client cuts its file short while the request waits
        with pytest.raises(PartUnreadable) as caught:
            padding.inputs([_request(5), short], 2, PaddedBatch())
    assert caught.value.index == 1
    assert "input 'IDS': region 'r': holds 8 of the 24 bytes" in caught.value.message
