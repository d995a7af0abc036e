"""Image classification: JPEG bytes -> ResNet-50 (torchvision, weights=None, seed 0).

Per batch: decode every image with Pillow and preprocess it with torchvision's transforms
in a thread pool (both release the GIL for their heavy parts), then one batched forward
pass on a single forward thread. ``execute`` is async, so with
``max_inflight_batches = 2`` the next batch decodes while this one runs the network.
Bytes that are not an image raise ``reposerve.InvalidInput``: that request gets a 400,
and the other requests of its batch still get their results.
"""

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor

from reposerve import InvalidInput


class Model:
    def load(self, context):
        import torch
        import torchvision

        torch.set_num_threads(context.threads)
        torch.manual_seed(0)
        self.torch = torch
        self.device = torch.device(context.device)
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
            context.config.optimization.precision
        ]
        self.net = torchvision.models.resnet50(weights=None).eval().to(self.device, self.dtype)
        transforms = torchvision.transforms
        self.transform = transforms.Compose(
            [
                transforms.Resize(256),
                transforms.CenterCrop(224),
                transforms.ToTensor(),
                transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            ]
        )
        self.decoders = ThreadPoolExecutor(max(2, context.threads), "decode")
        self.forwarder = ThreadPoolExecutor(1, "forward")

    def preprocess(self, blob: bytes):
        from PIL import Image

        try:
            with Image.open(io.BytesIO(blob)) as image:
                return self.transform(image.convert("RGB"))
        except (OSError, ValueError, Image.DecompressionBombError) as exc:  # Pillow's decode errors
            raise InvalidInput(
                f"IMAGE: {len(blob)} bytes that are not an image Pillow can read "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def forward(self, batch):
        torch = self.torch
        with torch.inference_mode():
            images = batch.to(self.device, self.dtype)
            logits = self.net(images).float()
            return logits.cpu().numpy(), logits.argmax(dim=1, keepdim=True).cpu().numpy()

    async def execute(self, inputs):
        loop = asyncio.get_running_loop()
        blobs = inputs["IMAGE"].reshape(-1)
        pixels = await asyncio.gather(
            *(loop.run_in_executor(self.decoders, self.preprocess, blob) for blob in blobs)
        )
        batch = self.torch.stack(pixels)
        logits, classes = await loop.run_in_executor(self.forwarder, self.forward, batch)
        return {"LOGITS": logits, "CLASS": classes}

    def unload(self):
        self.decoders.shutdown()
        self.forwarder.shutdown()
