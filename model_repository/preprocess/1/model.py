"""JPEG bytes -> ResNet-50's input, with Pillow and numpy (no torch in this process).

The same steps as torchvision's Resize(256), CenterCrop(224), ToTensor() and Normalize()
on a PIL image: bilinear resize of the short side to 256, the centre 224x224, pixels in
[0, 1], then ImageNet's mean and standard deviation per channel.
"""

import io

import numpy as np

from reposerve import InvalidInput

MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


class Model:
    def load(self, context):
        from PIL import Image  # the torch extra brings Pillow: fail the load, not requests

        self.image = Image

    def execute(self, inputs):
        blobs = inputs["IMAGE"].reshape(-1)
        return {"PIXELS": np.stack([self.pixels(blob) for blob in blobs])}

    def pixels(self, blob):
        Image = self.image  # noqa: N806 - Pillow's module, as it is usually named
        try:
            with Image.open(io.BytesIO(blob)) as image:
                image = image.convert("RGB")
                width, height = image.size
                short = 256
                if width <= height:
                    size = (short, int(short * height / width))
                else:
                    size = (int(short * width / height), short)
                image = image.resize(size, Image.BILINEAR)
                left = int(round((size[0] - 224) / 2.0))
                top = int(round((size[1] - 224) / 2.0))
                image = image.crop((left, top, left + 224, top + 224))
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise InvalidInput(
                f"IMAGE: {len(blob)} bytes that are not an image Pillow can read "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        chw = np.asarray(image, np.float32).transpose(2, 0, 1) / 255.0
        return (chw - MEAN) / STD
