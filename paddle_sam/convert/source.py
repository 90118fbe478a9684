"""What a model source is, decided once: :func:`sniff` reads a path cheaply (a sidecar, an export
manifest, key names from a pickle or a safetensors header, never the weights' data and never
unpickling) into a :class:`Source` record: family, layout, runtime and the parts it holds.

Every entry point takes its decisions from this record: the converter (which layout to map),
and the loading layer above (:mod:`paddle_sam.loading`: which model to build, which predictor
to wrap it in, and what to refuse). It lives here, below both, so that each reads the same
answer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import sam2, sam3, sam3_hf
from .core import PADDLE_SUFFIX, pdparams_shapes, read_sidecar, sidecar_family
from .torch_reader import read_zip_pickle

#: families this package reads
FAMILIES = ("sam_v1", "sam2", "sam3")

#: what a source can hold: ``image`` (an image model), ``clicks`` (point / box prompts for one
#: object: SAM v1, SAM 2, or SAM 3's tracker heads), ``text`` (SAM 3 concept prompts and
#: exemplar boxes), ``video`` (SAM 3's whole video tracker, or SAM 2's memory: memory encoder,
#: memory attention, pointers)
PARTS = ("image", "clicks", "text", "video")

#: the file an export folder describes itself in (``format``, ``version``, programs)
EXPORT_MANIFEST = "export.json"

#: runtimes: the dynamic model, or an export folder's
RUNTIMES = ("dynamic", "paddle-inference", "onnxruntime", "openvino")

_FAMILY_NAMES = {"sam_v1": "SAM v1", "sam2": "SAM 2", "sam3": "SAM 3"}
_PART_NAMES = {
    "image": "image model",
    "clicks": "clicks",
    "text": "text prompts",
    "video": "video tracker",
}


@dataclass(frozen=True)
class Source:
    """A model source as :func:`sniff` found it.

    ``layout``: ``"pdparams"`` (written by ``paddle-sam convert`` or ``train``),
    ``"official"`` (an upstream ``.pth`` / ``.pt`` / ``.safetensors``), ``"hf"`` (HF
    transformers: a ``.safetensors``, a sharded index or a model folder) or ``"export"`` (a
    ``paddle-sam export`` folder). ``family``: ``"sam_v1"``, ``"sam2"``, ``"sam3"`` or None
    where a cheap look cannot tell (a legacy pickle, a ``.pdparams`` without its sidecar).
    ``parts``: what it holds, of :data:`PARTS`; ``meta``: its sidecar or export manifest
    (``{}`` if none).
    """

    path: Path
    layout: str
    family: str | None
    runtime: str = "dynamic"
    parts: frozenset[str] = frozenset()
    model_type: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def format(self) -> str | None:
        """An export folder's ``format`` (e.g. ``paddle-sam/sam3-static``), else None."""
        return self.meta.get("format") if self.layout == "export" else None

    @property
    def exported(self) -> bool:
        return self.layout == "export"

    def describe(self) -> str:
        """``SAM 3 (pdparams: image model, text prompts)`` for messages."""
        family = _FAMILY_NAMES.get(self.family or "", "a model of unknown family")
        what = ", ".join(_PART_NAMES[p] for p in PARTS if p in self.parts) or "nothing known"
        runtime = "" if self.runtime == "dynamic" else f" on {self.runtime}"
        return f"{family} ({self.layout}{runtime}: {what})"

    def lacks(self, part: str) -> bool:
        return part not in self.parts


def sniff(path: str | os.PathLike, family: str | None = None) -> Source:
    """The :class:`Source` of ``path``: a checkpoint file, an HF folder or sharded index, or an
    export folder. ``family`` (from ``--model-type``) decides where the files cannot tell.

    Raises FileNotFoundError for a missing path; a folder that is not an export is read as an
    HF model folder (whose reader says what it lacks)."""
    path = Path(path)
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose from {', '.join(FAMILIES)}")
    if path.is_dir() and (path / EXPORT_MANIFEST).is_file():
        return _sniff_export(path)
    if sam3_hf.is_hf_source(path):
        if not path.exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        # a folder without the files is refused by the reader, naming what it looked for
        return Source(path, "hf", "sam3", parts=_SAM3_HF_PARTS, model_type="sam3")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == PADDLE_SUFFIX:
        return _sniff_pdparams(path, family)
    return _sniff_official(path, family)


# an HF SAM 3 has no tracker in the released layout (not mapped): no clicks, no video
_SAM3_HF_PARTS = frozenset({"image", "text"})
_SAM_V1_PARTS = frozenset({"image", "clicks"})
# SAM 2's state dict is one model: image encoder, SAM heads and the video memory together
_SAM2_PARTS = frozenset({"image", "clicks", "video"})


def _sam3_parts(keys: Any, *, clicks: bool | None = None) -> frozenset[str]:
    """SAM 3's parts from converted key names (anything with ``in``)."""
    has_clicks = any(k.startswith(sam3.INTERACTIVE_PREFIX) for k in keys)
    has_video = any(k.startswith(tuple(sam3.VIDEO_ONLY)) for k in keys)
    parts = {"image", "text"}
    if has_clicks and clicks is not False:
        parts.add("clicks")
    if has_video and "clicks" in parts:
        parts.add("video")
    return frozenset(parts)


def _sniff_pdparams(path: Path, family: str | None) -> Source:
    meta = read_sidecar(path) or {}
    found = sidecar_family(meta) if meta else None
    model_type = meta.get("model_type")
    if found == "sam_v1" or (found is None and family == "sam_v1"):
        return Source(
            path, "pdparams", "sam_v1", parts=_SAM_V1_PARTS, model_type=model_type, meta=meta
        )
    if found == "sam2" or (found is None and family == "sam2"):
        return Source(path, "pdparams", "sam2", parts=_SAM2_PARTS, model_type=model_type, meta=meta)
    if found == "sam3" or (found is None and family == "sam3"):
        # key names from the pickle, without the data; a file the reader refuses is left to
        # the loader's error (the parts are then the image model's only)
        try:
            keys: Any = pdparams_shapes(path)
        except Exception:  # noqa: BLE001 - any unreadable file: the loader says why
            keys = ()
        clicks = None if meta.get("interactive", True) is not False else False
        parts = _sam3_parts(keys, clicks=clicks)
        return Source(path, "pdparams", "sam3", parts=parts, model_type="sam3", meta=meta)
    return Source(path, "pdparams", None, model_type=model_type, meta=meta)


_SAM3_NEEDLE = (sam3.DETECTOR_PREFIX + "backbone.").encode()
_HF_SAM3_NEEDLES = (
    b'"vision_encoder.backbone.',  # HF Sam3Model (SAM v1's HF keys lack "backbone")
    b'"' + sam3_hf.HF_DETECTOR_PREFIX.encode() + b"vision_encoder.backbone.",
)
_CLICKS_NEEDLE = (sam3.TRACKER_PREFIX + "sam_mask_decoder.").encode()
_VIDEO_NEEDLE = (sam3.TRACKER_PREFIX + "maskmem_backbone.").encode()
_SAM2_NEEDLE = sam2.PATCH_EMBED_KEY.encode()


def _sniff_official(path: Path, family: str | None) -> Source:
    """An upstream file, from its key names: the pickle of a zip ``.pt`` / ``.pth`` (scanned as
    bytes, never unpickled) or the header of a ``.safetensors``."""
    sidecar = read_sidecar(path) or {}
    names = _key_bytes(path)
    if names is None:
        # a legacy pickle, or a file the reader will refuse with its reason: the family is the
        # caller's, and the parts are what that family can hold (the strict load decides)
        found = (sidecar_family(sidecar) if sidecar else None) or family
        if found == "sam3" and path.suffix.lower() == ".safetensors":  # only HF ships these
            return Source(path, "hf", "sam3", parts=_SAM3_HF_PARTS, model_type="sam3", meta=sidecar)
        parts = {"sam_v1": _SAM_V1_PARTS, "sam2": _SAM2_PARTS, "sam3": frozenset(PARTS)}.get(
            found or "", frozenset()
        )
        model_type = "sam3" if found == "sam3" else None
        return Source(path, "official", found, parts=parts, model_type=model_type, meta=sidecar)
    if any(n in names for n in _HF_SAM3_NEEDLES):
        return Source(path, "hf", "sam3", parts=_SAM3_HF_PARTS, model_type="sam3", meta=sidecar)
    if _SAM2_NEEDLE in names:
        return Source(path, "official", "sam2", parts=_SAM2_PARTS, meta=sidecar)
    if _SAM3_NEEDLE in names:
        parts = {"image", "text"}
        if _CLICKS_NEEDLE in names:
            parts.add("clicks")
            if _VIDEO_NEEDLE in names:
                parts.add("video")
        return Source(
            path, "official", "sam3", parts=frozenset(parts), model_type="sam3", meta=sidecar
        )
    layout = "hf" if b"vision_encoder." in names else "official"
    return Source(path, layout, "sam_v1", parts=_SAM_V1_PARTS, meta=sidecar)


def _key_bytes(path: Path) -> bytes | None:
    """The bytes that hold a checkpoint's key names (a zip pickle or a safetensors header), or
    None when they cannot be had cheaply."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
            return read_zip_pickle(path)
        if len(head) == 8:
            n = int.from_bytes(head, "little")
            if 2 <= n <= (100 << 20):
                with open(path, "rb") as f:
                    f.seek(8)
                    header = f.read(n)
                if header[:1] == b"{":
                    return header
    except OSError:
        return None
    return None


def _sniff_export(path: Path) -> Source:
    """An export folder, from its manifest's ``format`` (``paddle-sam/<family>-<kind>``); the
    runtime checks the manifest in full when it opens the folder."""
    try:
        meta = json.loads((path / EXPORT_MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path / EXPORT_MANIFEST}: not readable as JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path / EXPORT_MANIFEST}: not a JSON object")
    fmt = meta.get("format")
    name = fmt.split("/", 1)[-1] if isinstance(fmt, str) and fmt.startswith("paddle-sam/") else ""
    family, _, kind = name.rpartition("-")
    if family not in FAMILIES:
        # the runtime's own manifest check names what is wrong
        return Source(path, "export", None, "paddle-inference", meta=meta)
    if family == "sam2":  # the image encoder on OpenVINO, the rest the dynamic model
        model_type = meta.get("model_type")
        return Source(path, "export", family, "openvino", _SAM2_PARTS, model_type, meta)
    if family == "sam3" and kind == "onnx":  # the vision backbone on OpenVINO
        weights = path / "model.pdparams"
        try:
            keys: Any = pdparams_shapes(weights)
        except Exception:  # noqa: BLE001 - the runtime's manifest check names the file
            keys = ()
        clicks = None if (read_sidecar(weights) or {}).get("interactive", True) else False
        parts = _sam3_parts(keys, clicks=clicks)
        return Source(path, "export", family, "openvino", parts, "sam3", meta)
    runtime = "onnxruntime" if kind == "onnx" else "paddle-inference"
    parts = _SAM_V1_PARTS if family == "sam_v1" else frozenset({"image", "text"})
    model_type = meta.get("model_type") if family == "sam_v1" else "sam3"
    return Source(path, "export", family, runtime, parts, model_type, meta)


__all__ = ["EXPORT_MANIFEST", "FAMILIES", "PARTS", "RUNTIMES", "Source", "sniff"]
