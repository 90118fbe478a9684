"""SAM 3 as an interactive predictor: text and exemplar-box prompts through ``Sam3Processor``
(or the exported runtime's ``StaticSam3Processor``), clicks through ``predict_inst``; what the
CLI's ``segment`` and the service run.

``Sam3Predictor`` gives a SAM 3 image model the interface ``ModelService`` drives:
``set_image`` runs the backbone once and leaves the features in ``image_state`` (the session
state, ``session_state_keys``); ``predict`` answers one request on a private copy of that state
with every prompt reset first, so no prompt survives a request or crosses sessions.

What a request does:

- ``text`` alone: every instance of the phrase scoring above the confidence threshold;
- ``text`` and ``box``: the same, with the box as a positive exemplar of what is meant;
- ``box`` alone: SAM 3's exemplar search (the text encoder is prompted with "visual", as
  upstream does): every instance that looks like the boxed one, not only the boxed object;
- points (with an optional box) or ``mask_input`` (a previous mask), without text: SAM 3's
  interactive predictor, ``Sam3Image.predict_inst``, SAM v1 style (candidate masks of one
  object), when the model was built with ``enable_inst_interactivity=True`` (a checkpoint that
  has the tracker's weights); otherwise refused (``PromptNotSupported``). Points together
  with text are refused: the two paths answer different questions.

A grounding answer is ``(masks K x H x W bool, scores K, low_res_logits K x h x w)``, instances
best first; ``K`` may be 0, and ``multimask_output`` is ignored. An interactive answer is
``SamPredictor.predict``'s: 3 candidates (or 1) with their predicted IoU. ``ground`` takes
several exemplar boxes, each positive or negative, and also returns the instances' boxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import paddle
import paddle.nn.functional as F

from .processor import Sam3Processor, Sam3ProcessorBase


class PromptNotSupported(ValueError):
    """A prompt this model cannot answer; ``code`` is the service's error code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


POINTS_REFUSED = (
    "this SAM 3 model takes text and boxes only: point prompts need SAM 3's interactive "
    "predictor (predict_inst), which needs a checkpoint with the tracker's weights; describe "
    "the object with text or draw a box around one example"
)
MASK_REFUSED = (
    "this SAM 3 model cannot refine a previous mask: that needs SAM 3's interactive predictor "
    "(predict_inst), which needs a checkpoint with the tracker's weights"
)
POINTS_WITH_TEXT = (
    "points and text cannot be combined: text finds every instance of a concept, points "
    "segment one object; send one or the other"
)


def xyxy_to_cxcywh(box: Sequence[float] | np.ndarray, height: int, width: int) -> list[float]:
    """A box in pixels ``(x0, y0, x1, y1)`` -> ``(cx, cy, w, h)`` normalised by the image size,
    as ``Sam3Processor.add_geometric_prompt`` takes it."""
    x0, y0, x1, y1 = (float(v) for v in np.asarray(box, dtype=np.float64).reshape(4))
    return [(x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height]


class Instances(NamedTuple):
    """A grounding answer, best score first."""

    masks: np.ndarray  # K x H x W bool
    scores: np.ndarray  # K
    boxes: np.ndarray  # K x 4, x0 y0 x1 y1 pixels
    low_res_logits: np.ndarray  # K x h x w float32


class _HeadsCapture:
    """Stands in for a processor's ``_run_heads``, keeping the raw output of the last
    grounding (its low-resolution mask logits are the answer's ``low_res_logits``)."""

    def __init__(self, processor: Sam3ProcessorBase) -> None:
        self._run_heads = processor._run_heads
        self.last: dict[str, Any] | None = None
        processor._run_heads = self

    def __call__(self, state: dict) -> dict[str, Any]:
        self.last = self._run_heads(state)
        return self.last


class Sam3Predictor:
    """A SAM 3 image model (``Sam3Image``) as the service's predictor: text and box prompts,
    and clicks when the model has the interactive predictor.

    ``Sam3Predictor(model)`` builds its ``Sam3Processor``; ``Sam3Predictor(processor=p)`` wraps
    a processor with ``Sam3Processor``'s API, e.g. the exported runtime's
    ``StaticSam3Processor`` (text and boxes only). ``confidence_threshold``: default 0.5 for a
    model, the processor's own for a processor.
    """

    takes_text = True
    mask_refusal = MASK_REFUSED
    returns_instances = True  # an answer is a set of instances, not 1-of-3 candidates
    model_type = "sam3"
    session_state_keys = ("image_state",)
    everything_refusal = (
        "'everything' mode is not supported for SAM 3; ask for a concept with a text prompt "
        "(every instance above the threshold comes back)"
    )

    def __init__(
        self,
        model: Any = None,
        confidence_threshold: float | None = None,
        resolution: int | None = None,
        *,
        processor: Sam3ProcessorBase | None = None,
    ) -> None:
        if (model is None) == (processor is None):
            raise TypeError("Sam3Predictor takes a model or a processor (exactly one)")
        if processor is not None and resolution is not None:
            raise TypeError("a processor has its own resolution")
        if confidence_threshold is None:
            confidence_threshold = 0.5 if processor is None else processor.confidence_threshold
        if not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        if processor is None:
            if resolution is None:  # the model's input size (1008 for the released model)
                spec = getattr(model, "spec", None)
                resolution = int(
                    spec.image_size
                    if spec is not None
                    else getattr(model.backbone.vision_backbone.trunk, "img_size", 1008)
                )
            processor = Sam3Processor(
                model, resolution=resolution, confidence_threshold=confidence_threshold
            )
        else:
            processor.set_confidence_threshold(confidence_threshold)
        self.model = model
        self.processor = processor
        self._heads = _HeadsCapture(processor)
        self.image_state: dict[str, Any] | None = None
        self.is_image_set = False

    @property
    def takes_points(self) -> bool:
        """Clicks work when the model has the interactive predictor (``predict_inst``)."""
        return getattr(self.model, "inst_interactive_predictor", None) is not None

    takes_mask_input = takes_points

    @staticmethod
    def is_interactive(text: str | None, has_points: bool, has_mask: bool) -> bool:
        """Whether a request goes to ``predict_inst`` (else to text/exemplar grounding)."""
        return not (text or "").strip() and (has_points or has_mask)

    @property
    def confidence_threshold(self) -> float:
        return self.processor.confidence_threshold

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Run the backbone on an ``H x W x 3`` uint8 image; the features become the state."""
        if image_format not in ("RGB", "BGR"):
            raise ValueError(f"image_format must be 'RGB' or 'BGR', got {image_format!r}")
        if image_format == "BGR":
            image = np.ascontiguousarray(image[..., ::-1])
        self.image_state = self.processor.set_image(image)
        self.is_image_set = True

    def _private_state(self) -> dict[str, Any]:
        """A copy of the image state that this request's prompts may change freely."""
        if self.image_state is None:
            raise RuntimeError("call set_image before predict")
        state = dict(self.image_state)
        state["backbone_out"] = dict(self.image_state["backbone_out"])
        self.processor.reset_all_prompts(state)
        return state

    @paddle.no_grad()
    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        text: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Instances for ``text`` and/or an exemplar ``box`` (x0, y0, x1, y1 pixels); or, for
        points / ``mask_input`` without text, ``predict_inst``'s candidate masks."""
        has_points = point_coords is not None and len(point_coords) > 0
        if text is not None and not text.strip():
            text = None
        if has_points and text is not None:
            raise PromptNotSupported("invalid_prompt", POINTS_WITH_TEXT)
        if self.is_interactive(text, has_points, mask_input is not None):
            if not self.takes_points:
                code, detail = (
                    ("points_not_supported", POINTS_REFUSED)
                    if has_points
                    else ("mask_not_supported", MASK_REFUSED)
                )
                raise PromptNotSupported(code, detail)
            masks, ious, low_res = self.model.predict_inst(
                self._private_state(),
                point_coords=point_coords if has_points else None,
                point_labels=point_labels if has_points else None,
                box=box,
                mask_input=mask_input,
                multimask_output=multimask_output,
            )
            return masks > 0.5, ious.astype(np.float32), low_res.astype(np.float32)
        boxes = []
        if box is not None:
            x0, y0, x1, y1 = (float(v) for v in np.asarray(box, dtype=np.float64).reshape(4))
            if not (x1 > x0 and y1 > y0):
                raise ValueError(f"box must have x1 > x0 and y1 > y0, got {[x0, y0, x1, y1]}")
            boxes.append([x0, y0, x1, y1])
        found = self.ground(text, boxes)
        return found.masks, found.scores.astype(np.float32), found.low_res_logits

    @paddle.no_grad()
    def ground(
        self,
        text: str | None = None,
        boxes: Sequence[Sequence[float]] | np.ndarray = (),
        box_labels: Sequence[bool] | None = None,
    ) -> Instances:
        """Every instance of ``text`` and/or the exemplar ``boxes`` (x0, y0, x1, y1 pixels;
        ``box_labels``: True = positive, the default, False = a counter-example), prompted in
        that order: the text, then the boxes."""
        labels = [True] * len(boxes) if box_labels is None else [bool(v) for v in box_labels]
        if len(labels) != len(boxes):
            raise ValueError(f"{len(boxes)} boxes but {len(labels)} box labels")
        if text is None and len(boxes) == 0:
            raise ValueError("SAM 3 needs a text prompt, a box, or both")
        state = self._private_state()
        h, w = state["original_height"], state["original_width"]
        self._heads.last = None
        if text is not None:
            state = self.processor.set_text_prompt(text, state)
        for b, label in zip(boxes, labels, strict=True):
            state = self.processor.add_geometric_prompt(xyxy_to_cxcywh(b, h, w), label, state)
        return self._answer(state)

    def _answer(self, state: dict[str, Any]) -> Instances:
        masks = state["masks"].numpy()[:, 0]  # K x H x W
        scores = state["scores"].numpy()
        boxes = state["boxes"].numpy()
        out = self._heads.last
        # the kept queries, in the processor's order (ascending query index)
        probs = F.sigmoid(out["pred_logits"]) * F.sigmoid(out["presence_logit_dec"]).unsqueeze(1)
        keep = np.nonzero(probs.squeeze(-1).numpy()[0] > self.processor.confidence_threshold)[0]
        low_res = out["pred_masks"].numpy()[0][keep].astype(np.float32)  # K x h x w logits
        if len(keep) != len(scores):
            raise RuntimeError("SAM 3 answer: kept queries disagree with the processor's")
        order = np.argsort(-scores, kind="stable")  # best first
        return Instances(masks[order], scores[order], boxes[order], low_res[order])


__all__ = ["Instances", "PromptNotSupported", "Sam3Predictor", "xyxy_to_cxcywh"]
