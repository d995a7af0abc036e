"""The bundled image examples: tools/export_examples.py output served by onnxruntime and
torch, the image_classifier pipeline and the image_pipeline ensemble on real JPEG bytes,
all against direct runs."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server import REPO_ROOT, start_server

torch = pytest.importorskip("torch", reason="the torch extra is not installed")
torchvision = pytest.importorskip("torchvision", reason="the torch extra is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
Image = pytest.importorskip("PIL.Image", reason="pillow is not installed")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for name in ("image_classifier", "preprocess", "postprocess"):
        shutil.copytree(REPO_ROOT / "model_repository" / name, root / name)
    subprocess.run(
        [sys.executable, "tools/export_examples.py", "--repository", str(root)],
        cwd=REPO_ROOT,
        check=True,
        timeout=600,
    )
    server = start_server(root, tmp_path_factory.mktemp("log"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def client(server):
    client = httpclient.InferenceServerClient(server.address, network_timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


def _jpeg(seed: int, size: tuple[int, int]) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def _preprocess(blob: bytes) -> torch.Tensor:
    transforms = torchvision.transforms
    pipeline = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    with Image.open(io.BytesIO(blob)) as image:
        return pipeline(image.convert("RGB"))


def test_exported_resnets_match_the_network(client, resnet):
    images = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = resnet(images).numpy()
    for model in ("resnet50_onnx", "resnet50_torch"):
        tensor = httpclient.InferInput("input", [2, 3, 224, 224], "FP32")
        tensor.set_data_from_numpy(images.numpy())
        logits = client.infer(model, [tensor]).as_numpy("logits")
        np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-3, err_msg=model)


def test_image_classifier_on_jpeg_bytes(client, resnet):
    blobs = [_jpeg(0, (300, 400)), _jpeg(1, (256, 256)), _jpeg(2, (480, 320))]
    tensor = httpclient.InferInput("IMAGE", [3, 1], "BYTES")
    tensor.set_data_from_numpy(np.array(blobs, dtype=object).reshape(3, 1))
    result = client.infer("image_classifier", [tensor])
    with torch.inference_mode():
        expected = resnet(torch.stack([_preprocess(blob) for blob in blobs])).numpy()
    np.testing.assert_allclose(result.as_numpy("LOGITS"), expected, rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(result.as_numpy("CLASS")[:, 0], expected.argmax(axis=1))


def test_one_bad_image_among_eight_clients_fails_alone(server, resnet):
    from tritonclient.utils import InferenceServerException

    blobs = [_jpeg(10 + i, (240, 320)) for i in range(8)]
    blobs[2] = b"not a jpeg"
    client = httpclient.InferenceServerClient(server.address, concurrency=8, network_timeout=300)
    pending = []
    for blob in blobs:
        tensor = httpclient.InferInput("IMAGE", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[blob]], dtype=object))
        pending.append(client.async_infer("image_classifier", [tensor]))
    with pytest.raises(InferenceServerException) as caught:
        pending[2].get_result()
    assert caught.value.status() == "400"
    assert caught.value.message().startswith(
        "IMAGE: 10 bytes that are not an image Pillow "
        "can read (UnidentifiedImageError: cannot identify image file"
    )
    good = [i for i in range(8) if i != 2]
    with torch.inference_mode():
        expected = resnet(torch.stack([_preprocess(blobs[i]) for i in good])).numpy()
    for row, i in enumerate(good):
        logits = pending[i].get_result().as_numpy("LOGITS")[0]
        np.testing.assert_allclose(logits, expected[row], rtol=1e-3, atol=1e-3)
    client.close()


def test_image_pipeline_ensemble_gives_the_networks_top_five(client, resnet):
    """preprocess -> resnet50_onnx -> postprocess on JPEG bytes: the five likeliest
    classes of torchvision's own preprocessing and network, with their probabilities."""
    blobs = [_jpeg(20, (300, 400)), _jpeg(21, (256, 256)), _jpeg(22, (480, 320))]
    tensor = httpclient.InferInput("IMAGE", [3, 1], "BYTES")
    tensor.set_data_from_numpy(np.array(blobs, dtype=object).reshape(3, 1))
    result = client.infer("image_pipeline", [tensor])
    with torch.inference_mode():
        logits = resnet(torch.stack([_preprocess(blob) for blob in blobs])).double()
        expected = torch.softmax(logits, dim=1).numpy()
    ids, scores = result.as_numpy("CLASS_IDS"), result.as_numpy("SCORES")
    assert ids.shape == (3, 5) and scores.shape == (3, 5)
    np.testing.assert_array_equal(ids[:, 0], expected.argmax(axis=1))
    np.testing.assert_allclose(scores, np.take_along_axis(expected, ids, 1), atol=1e-4)
    assert (np.diff(scores, axis=1) <= 0).all()  # most likely first
    config = client.get_model_config("image_pipeline")
    steps = [step["model_name"] for step in config["ensemble_scheduling"]["step"]]
    assert steps == ["preprocess", "resnet50_onnx", "postprocess"]
