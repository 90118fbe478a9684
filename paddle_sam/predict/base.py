"""What the segmentation service needs from a predictor, declared as a ``Protocol``.

``SamPredictor`` and the exported SAM v1 runtimes get the members' defaults from
``PredictorBase``; ``Sam3Predictor`` declares its own.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class InteractivePredictor(Protocol):
    """A predictor whose per-image state can be swapped between sessions.

    After ``set_image`` the image's state is the attributes named by ``session_state_keys``:
    the service keeps them per session and sets them back, with ``is_image_set = True``,
    before each ``predict``.
    """

    is_image_set: bool

    @property
    def session_state_keys(self) -> tuple[str, ...]:
        """The attributes that make up one image's state after ``set_image``."""
        ...

    @property
    def takes_text(self) -> bool:
        """Whether ``predict`` takes ``text: str | None`` (SAM 3)."""
        ...

    @property
    def takes_points(self) -> bool:
        """Whether point prompts are answered."""
        ...

    @property
    def takes_mask_input(self) -> bool:
        """Whether ``mask_input`` (a previous answer's low-res logits) is answered."""
        ...

    @property
    def returns_instances(self) -> bool:
        """Whether an answer can be a set of instances (all shown) rather than candidate
        masks of one object (one shown); see ``is_interactive``."""
        ...

    @property
    def model_type(self) -> str | None:
        """The model's name, or None to derive it from the model's spec."""
        ...

    @property
    def everything_refusal(self) -> str | None:
        """Why 'everything' mode is refused, or None for the service's own reason."""
        ...

    @property
    def mask_refusal(self) -> str | None:
        """Why ``mask_input`` is refused when ``takes_mask_input`` is False, or None for the
        service's own reason."""
        ...

    def is_interactive(self, text: str | None, has_points: bool, has_mask: bool) -> bool:
        """Whether a request is answered with candidate masks of one object."""
        ...

    def set_image(self, image: np.ndarray, image_format: str = "RGB") -> None:
        """Compute the state of an H x W x 3 uint8 image."""
        ...

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks (C x H x W bool), scores (C) and low-res logits (C x h x w) for the prompts
        on the current image; with ``takes_text`` it also takes ``text``."""
        ...


__all__ = ["InteractivePredictor"]
