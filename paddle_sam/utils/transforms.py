"""``segment_anything.utils.transforms`` under paddle-sam: the predictor's ``ResizeLongestSide``
(``apply_image``, ``apply_coords``, ``apply_boxes``, their ``*_torch`` forms, which also take
PyTorch tensors, and the ``*_paddle`` ones)."""

from ..predict.sam_v1.transforms import ResizeLongestSide

__all__ = ["ResizeLongestSide"]
