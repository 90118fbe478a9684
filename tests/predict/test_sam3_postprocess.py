"""SAM 3's mask post-processing: the upscaled masks' probabilities, computed in place when the
result is large, equal Paddle's sigmoid of the upscaled logits and torch's (upstream's
``interpolate`` then ``sigmoid``)."""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from paddle_sam.models.common import resize_bilinear
from paddle_sam.predict.sam3 import processor

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("n", [2, 40])  # 40 x 768 x 1024 is over SIGMOID_IN_PLACE_FROM
def test_upscaled_probabilities(n):
    rng = np.random.default_rng(n)
    logits = (rng.standard_normal((n, 1, 72, 72)) * 8).astype(np.float32)
    size = (768, 1024)
    assert (n * size[0] * size[1] >= processor.SIGMOID_IN_PLACE_FROM) == (n == 40)
    with paddle.no_grad():
        got = processor.upscaled_probabilities(paddle.to_tensor(logits), size).numpy()
        plain = F.sigmoid(resize_bilinear(paddle.to_tensor(logits), size)).numpy()
    np.testing.assert_array_equal(got, plain)
    ref = torch.nn.functional.interpolate(
        torch.from_numpy(logits), size=size, mode="bilinear", align_corners=False
    ).sigmoid()
    np.testing.assert_allclose(got, ref.numpy(), atol=2e-6, rtol=0)
    assert ((got > 0.5) == (ref.numpy() > 0.5)).mean() > 0.99999
