"""``segment_anything.utils`` under paddle-sam: ``paddle_sam.utils.transforms`` and
``paddle_sam.utils.amg`` re-export the predictor's helpers under upstream's module paths, so
``from segment_anything.utils.transforms import ResizeLongestSide`` becomes
``from paddle_sam.utils.transforms import ResizeLongestSide``.

Like upstream's, this package imports none of its modules until asked for them.
"""
