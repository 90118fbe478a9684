"""What a worker runs on one image: SAM v1's or SAM 2's automatic masks (``--everything``) or
every instance of SAM 3 concepts (``--text``), as COCO annotations without ids."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..predict.io import coco_annotation
from ..predict.sam_v1.automatic_mask_generator import generator_defaults

# the generator options a labelling job may set (upstream's names), with their defaults
EVERYTHING_DEFAULTS: dict[str, Any] = generator_defaults()


@dataclass(frozen=True)
class LabelSpec:
    """Everything a worker needs to build its labeller (picklable, JSON-able): the model
    (``checkpoint`` or ``exported`` folder, ``model_type``), the mode and its options."""

    mode: str  # "everything" or "concepts"
    checkpoint: str | None = None
    exported: str | None = None
    model_type: str | None = None
    everything: dict[str, Any] = field(default_factory=dict)
    prompts: tuple[str, ...] = ()
    confidence_threshold: float = 0.5
    bpe: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompts"] = list(self.prompts)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LabelSpec:
        return cls(**{**d, "prompts": tuple(d.get("prompts", ()))})

    def source(self, family: str) -> Any:
        """The model source: the export folder, the checkpoint or the bundled model of
        ``family`` (:func:`paddle_sam.loading.resolve`)."""
        from ..loading import resolve

        return resolve(self.checkpoint, self.exported, self.model_type, family=family)

    def categories(self) -> list[dict[str, Any]]:
        """COCO categories: one "object" for automatic masks, one per prompt for concepts."""
        if self.mode == "everything":
            return [{"id": 1, "name": "object", "supercategory": "object"}]
        return [
            {"id": i, "name": p, "supercategory": "concept"} for i, p in enumerate(self.prompts, 1)
        ]


def build_labeler(spec: LabelSpec) -> Any:
    """The labeller of ``spec``: an object with ``label(image) -> list of annotations``."""
    if spec.mode == "everything":
        return EverythingLabeler(spec)
    if spec.mode == "concepts":
        return ConceptLabeler(spec)
    raise ValueError(f"unknown labelling mode {spec.mode!r}")


def _annotation(mask: np.ndarray, score: float, category_id: int, **extra) -> dict | None:
    """A COCO annotation of ``mask`` (bbox its own box); None for an empty mask."""
    return coco_annotation(mask, category_id=category_id, score=float(score), **extra)


class EverythingLabeler:
    """The automatic mask generator of SAM v1 (dynamic model or Paddle Inference export) or of
    SAM 2."""

    def __init__(self, spec: LabelSpec) -> None:
        from ..loading import load_image_predictor
        from ..predict.sam_v1.automatic_mask_generator import SamAutomaticMaskGenerator

        source = spec.source("sam_v1")
        options = {**EVERYTHING_DEFAULTS, **spec.everything}
        if source.family == "sam2":
            from ..predict.sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

            # the predictor's model: a checkpoint's, or an export's (image encoder on OpenVINO)
            model = load_image_predictor(source, model_type=spec.model_type).model
            self.generator: Any = SAM2AutomaticMaskGenerator(
                model,
                output_mode="binary_mask",
                **options,
            )
            return
        model = load_image_predictor(source, model_type=spec.model_type)
        if not hasattr(model, "predict_point_grid"):
            raise ValueError(
                f"--exported {spec.exported}: --everything runs on a Paddle Inference export of "
                "SAM v1 (paddle-sam export --format pir), not on this one"
            )
        self.generator = SamAutomaticMaskGenerator(model, output_mode="binary_mask", **options)

    def label(self, image: np.ndarray) -> list[dict]:
        out = []
        for r in self.generator.generate(image):
            ann = _annotation(
                r["segmentation"],
                r["predicted_iou"],
                1,
                predicted_iou=float(r["predicted_iou"]),
                stability_score=float(r["stability_score"]),
                point_coords=[[float(v) for v in p] for p in r["point_coords"]],
            )
            if ann is not None:
                out.append(ann)
        return out


class ConceptLabeler:
    """SAM 3: every instance of each text prompt, one category per prompt; the image is
    embedded once and each prompt reruns the heads only."""

    def __init__(self, spec: LabelSpec) -> None:
        from ..loading import load_image_predictor

        self.predictor = load_image_predictor(
            spec.source("sam3"),
            bpe=spec.bpe,
            confidence_threshold=spec.confidence_threshold,
            clicks=False,
        )
        self.prompts = spec.prompts

    def label(self, image: np.ndarray) -> list[dict]:
        self.predictor.set_image(image)
        out = []
        for category_id, text in enumerate(self.prompts, 1):
            found = self.predictor.ground(text, [], [])
            for mask, box, score in zip(found.masks, found.boxes, found.scores, strict=True):
                ann = _annotation(
                    mask, score, category_id, detector_box_xyxy=[float(v) for v in box]
                )
                if ann is not None:  # an empty mask has no place in COCO
                    out.append(ann)
        return out
