"""SAM 3 key map: the HF transformers layout -> the released ``sam3.pt`` layout.

HF ships SAM 3 as a folder (``config.json`` + ``model.safetensors``, maybe sharded). Two
layouts occur: ``Sam3Model.save_pretrained`` writes the image model's keys bare
(``vision_encoder.*``, ``text_encoder.*``, ``detr_decoder.*``, ...); the hub's ``facebook/sam3``
(a ``Sam3VideoModel``) puts them under ``detector_model.`` next to ``tracker_neck.*`` and
``tracker_model.*``. :func:`hf_to_released` renames HF keys to the released names and undoes
what HF changed in the tensors, so the released -> Paddle plan (:mod:`.sam3`) and all its
strict checks apply unchanged:

* q/k/v projections that HF keeps apart are re-fused (ViT ``attn.qkv``, ``in_proj_*`` of
  every ``nn.MultiheadAttention``); all three parts must be present with equal shapes;
* the ViT's ``pos_embed`` gets back the cls-token row HF strips (zeros: the model drops that
  row before use, :data:`FILLED`);
* the CLIP ``text_projection`` is transposed back (HF: a Linear ``[out, in]``; released: a
  plain ``[in, out]`` parameter used as ``x @ P``);
* HF has no ``freqs_cis`` (it recomputes RoPE; so do we) and no point path in the geometry
  encoder (:data:`FILLED`); its SAM 2 style tracker is not mapped (:data:`UNMAPPED_PREFIXES`).

The rules below are written from the layout of transformers' ``Sam3Model`` (checked against it
in ``tests/convert/test_sam3_convert_hf.py``), not copied from its conversion script.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from .core import CheckpointFormatError, CheckpointMismatchError
from .sam3 import DETECTOR_PREFIX
from .torch_reader import load_state_dict

HF_DETECTOR_PREFIX = "detector_model."  # Sam3VideoModel (facebook/sam3 on the hub)
HF_TRACKER_NECK_PREFIX = "tracker_neck."  # its second FPN neck (released: sam2_convs)

# HF keys deliberately not converted, by prefix, with the reason.
UNMAPPED_PREFIXES = {
    "tracker_model.": "HF's SAM 2 style tracker (video tracking and the heads of predict_inst) "
    "is laid out differently from the released tracker and is not mapped: a model converted "
    "from an HF checkpoint has no instance interactivity",
}

# Released keys an HF checkpoint does not hold, filled in by hf_to_released, with the reason.
_POINTS = ("points_direct_project", "points_pool_project", "points_pos_enc_project")
FILLED = {
    "backbone.vision_backbone.trunk.pos_embed": "row 0 (the cls-token position, which HF "
    "strips) is filled with zeros: the ViT drops that row before use (get_abs_pos)",
    **{
        f"geometry_encoder.{name}.": "HF's geometry encoder has no point path (boxes only): "
        "filled with NaN so a point prompt to the detector fails loudly instead of silently "
        "(text and box prompts, and predict_inst, never use these weights)"
        for name in _POINTS
    },
}

# (pattern, replacement) on a key without the detector prefix; the first match renames it.
# q/k/v keys arrive as ``<module>.qkv_fused.<leaf>`` (see hf_to_released). Afterwards (rename):
# short prefixes are expanded (_SHORT), HF's ``mlp.layer1/2/3`` become ``layers.0/1/2``, the
# attentions' ``o_proj`` becomes ``out_proj`` and ``qkv_fused.`` becomes ``in_proj_``.
_RULES: list[tuple[str, str]] = [
    # vision trunk (PE ViT)
    (r"^{V}embeddings\.position_embeddings$", "trunk.pos_embed"),
    (r"^{V}embeddings\.patch_embeddings\.projection\.", "trunk.patch_embed.proj."),
    (r"^{V}layer_norm\.", "trunk.ln_pre."),
    (r"^{VL}layer_norm([12])\.", r"trunk.blocks.\1.norm\2."),
    (r"^{VL}attention\.qkv_fused\.", r"trunk.blocks.\1.attn.qkv."),
    (r"^{VL}attention\.o_proj\.", r"trunk.blocks.\1.attn.proj."),
    (r"^{VL}mlp\.(fc[12])\.", r"trunk.blocks.\1.mlp.\2."),
    # FPN necks: the detector's (convs) and the tracker's (sam2_convs); see _fpn_rename
    (r"^vision_encoder\.neck\.fpn_layers\.", "convs."),
    (r"^tracker_neck\.fpn_layers\.", "sam2_convs."),
    # text encoder (CLIP) and the projection to d_model
    (r"^{T}embeddings\.token_embedding\.", "text.token_embedding."),
    (r"^{T}embeddings\.position_embedding\.weight$", "text.positional_embedding"),
    (r"^{T}final_layer_norm\.", "text.ln_final."),
    (r"^text_encoder\.text_projection\.weight$", "text.text_projection"),
    (r"^{TL}self_attn\.qkv_fused\.", r"text.resblocks.\1.attn.qkv_fused."),
    (r"^{TL}self_attn\.out_proj\.", r"text.resblocks.\1.attn.out_proj."),
    (r"^{TL}layer_norm([12])\.", r"text.resblocks.\1.ln_\2."),
    (r"^{TL}mlp\.fc1\.", r"text.resblocks.\1.mlp.c_fc."),
    (r"^{TL}mlp\.fc2\.", r"text.resblocks.\1.mlp.c_proj."),
    (r"^text_projection\.", "backbone.language_backbone.resizer."),
    # geometry encoder
    (r"^{GL}cross_attn\.", r"geo.encode.\1.cross_attn_image."),
    (r"^{GL}self_attn\.", r"geo.encode.\1.self_attn."),
    (r"^{GL}mlp\.fc([12])\.", r"geo.encode.\1.linear\2."),
    (r"^{GL}layer_norm([123])\.", r"geo.encode.\1.norm\2."),
    (r"^geometry_encoder\.vision_layer_norm\.", "geo.img_pre_norm."),
    (r"^geometry_encoder\.prompt_layer_norm\.", "geo.norm."),
    (r"^geometry_encoder\.output_layer_norm\.", "geo.encode_norm."),
    (r"^geometry_encoder\.((label|cls)_embed|boxes_\w+|final_proj)\.", r"geo.\1."),
    # DETR encoder
    (r"^{EL}cross_attn\.", r"enc.\1.cross_attn_image."),
    (r"^{EL}self_attn\.", r"enc.\1.self_attn."),
    (r"^{EL}mlp\.fc([12])\.", r"enc.\1.linear\2."),
    (r"^{EL}layer_norm([123])\.", r"enc.\1.norm\2."),
    # DETR decoder
    (r"^{DL}self_attn\.", r"dec.layers.\1.self_attn."),
    (r"^{DL}text_cross_attn\.", r"dec.layers.\1.ca_text."),
    (r"^{DL}vision_cross_attn\.", r"dec.layers.\1.cross_attn."),
    (r"^{DL}mlp\.fc([12])\.", r"dec.layers.\1.linear\2."),
    (r"^{DL}vision_cross_attn_layer_norm\.", r"dec.layers.\1.norm1."),
    (r"^{DL}text_cross_attn_layer_norm\.", r"dec.layers.\1.catext_norm."),
    (r"^{DL}self_attn_layer_norm\.", r"dec.layers.\1.norm2."),
    (r"^{DL}mlp_layer_norm\.", r"dec.layers.\1.norm3."),
    (r"^detr_decoder\.(query_embed|reference_points|presence_token)\.", r"dec.\1."),
    (r"^detr_decoder\.presence_head\.", "dec.presence_token_head.mlp."),
    (r"^detr_decoder\.presence_layer_norm\.", "dec.presence_token_out_norm."),
    (r"^detr_decoder\.output_layer_norm\.", "dec.norm."),
    (r"^detr_decoder\.box_head\.", "dec.bbox_embed.mlp."),
    (r"^detr_decoder\.ref_point_head\.", "dec.ref_point_head.mlp."),
    (r"^detr_decoder\.box_rpb_embed_([xy])\.", r"dec.boxRPB_embed_\1.mlp."),
    # dot-product scoring
    (r"^dot_product_scoring\.text_mlp\.", "dot_prod_scoring.prompt_mlp.mlp."),
    (r"^dot_product_scoring\.text_mlp_out_norm\.", "dot_prod_scoring.prompt_mlp.out_norm."),
    (r"^dot_product_scoring\.text_proj\.", "dot_prod_scoring.prompt_proj."),
    (r"^dot_product_scoring\.query_proj\.", "dot_prod_scoring.hs_proj."),
    # segmentation head
    (r"^mask_decoder\.pixel_decoder\.", "seg.pixel_decoder."),
    (r"^mask_decoder\.mask_embedder\.", "seg.mask_predictor.mask_embed."),
    (r"^mask_decoder\.instance_projection\.", "seg.instance_seg_head."),
    (r"^mask_decoder\.semantic_projection\.", "seg.semantic_seg_head."),
    (r"^mask_decoder\.prompt_cross_attn_norm\.", "seg.cross_attn_norm."),
    (r"^mask_decoder\.prompt_cross_attn\.", "seg.cross_attend_prompt."),
]
# HF module paths the patterns above abbreviate
_HF_SHORT = {
    "VL": r"vision_encoder\.backbone\.layers\.(\d+)\.",
    "V": r"vision_encoder\.backbone\.",
    "TL": r"text_encoder\.text_model\.encoder\.layers\.(\d+)\.",
    "T": r"text_encoder\.text_model\.",
    "GL": r"geometry_encoder\.layers\.(\d+)\.",
    "EL": r"detr_encoder\.layers\.(\d+)\.",
    "DL": r"detr_decoder\.layers\.(\d+)\.",
}
_COMPILED = [(re.compile(p.format(**_HF_SHORT)), r) for p, r in _RULES]

# released module paths the replacements abbreviate (expanded by prefix, first match)
_SHORT = {
    "trunk.": "backbone.vision_backbone.trunk.",
    "convs.": "backbone.vision_backbone.convs.",
    "sam2_convs.": "backbone.vision_backbone.sam2_convs.",
    "text.resblocks.": "backbone.language_backbone.encoder.transformer.resblocks.",
    "text.": "backbone.language_backbone.encoder.",
    "geo.": "geometry_encoder.",
    "enc.": "transformer.encoder.layers.",
    "dec.": "transformer.decoder.",
    "seg.": "segmentation_head.",
}

_QKV = re.compile(r"^(.*)\.([qkv])_proj\.(weight|bias)$")


def is_hf_sam3_layout(keys: Iterable[str]) -> bool:
    """True for the HF transformers SAM 3 layout (bare ``Sam3Model`` or ``detector_model.``)."""
    for key in keys:
        if key.startswith(HF_DETECTOR_PREFIX):
            key = key[len(HF_DETECTOR_PREFIX) :]
        if key.startswith(("vision_encoder.backbone.", "detr_decoder.")):
            return True
    return False


def unmapped_reason(key: str) -> str | None:
    for prefix, reason in UNMAPPED_PREFIXES.items():
        if key.startswith(prefix):
            return reason
    return None


def rename(key: str) -> str | None:
    """HF key (detector prefix removed, q/k/v as ``qkv_fused``) -> released key without
    ``detector.``; None when no rule applies."""
    for pattern, repl in _COMPILED:
        new, n = pattern.subn(repl, key, count=1)
        if n:
            break
    else:
        return None
    for short, full in _SHORT.items():
        if new.startswith(short):
            new = full + new[len(short) :]
            break
    new = re.sub(r"\.mlp\.layer(\d)\.", lambda m: f".layers.{int(m.group(1)) - 1}.", new)
    return new.replace(".o_proj.", ".out_proj.").replace(".qkv_fused.", ".in_proj_")


def _fpn_rename(key: str, levels_with_two: set[str]) -> str:
    """FPN levels: HF ``proj1`` / ``proj2`` are ``conv_1x1`` / ``conv_3x3``; ``scale_layers.0`` /
    ``.2`` are ``dconv_2x2_0`` / ``dconv_2x2_1`` on a level with two transposed convs (scale 4),
    else ``scale_layers.0`` is ``dconv_2x2`` (scale 2; scale 0.5 is a parameter-free max pool)."""
    key = re.sub(r"(convs\.\d+\.)proj1\.", r"\1conv_1x1.", key)
    key = re.sub(r"(convs\.\d+\.)proj2\.", r"\1conv_3x3.", key)
    m = re.match(r"^(.*(?:convs)\.\d+\.)scale_layers\.(\d+)\.(weight|bias)$", key)
    if not m:
        return key
    level, idx, leaf = m.groups()
    if level in levels_with_two:
        name = {"0": "dconv_2x2_0", "2": "dconv_2x2_1"}.get(idx)
    else:
        name = {"0": "dconv_2x2"}.get(idx)
    return f"{level}{name}.{leaf}" if name else key


def hf_to_released(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF transformers SAM 3 state dict -> the released layout (``detector.*`` keys, torch
    shapes), ready for :func:`paddle_sam.convert.sam3.convert_state_dict`.

    Every HF key is renamed, re-fused or dropped with a reason (:data:`UNMAPPED_PREFIXES`);
    anything else raises :class:`CheckpointMismatchError` naming all the keys at once. Missing
    or extra released keys are left for the strict check against the model."""
    problems: list[str] = []
    renamed: dict[str, str] = {}  # released key (without detector.) <- HF key
    fused: dict[str, dict[str, str]] = {}  # released in_proj/qkv key -> {q/k/v: HF key}
    for hf_key in state:
        if unmapped_reason(hf_key) is not None:
            continue
        key = hf_key
        if key.startswith(HF_DETECTOR_PREFIX):
            key = key[len(HF_DETECTOR_PREFIX) :]
        m = _QKV.match(key)
        probe = f"{m.group(1)}.qkv_fused.{m.group(3)}" if m else key
        new = rename(probe)
        if new is None:
            problems.append(f"{hf_key}: no rule maps this HF key to the released layout")
            continue
        if m:
            fused.setdefault(new, {})[m.group(2)] = hf_key
            continue
        if new in renamed:
            problems.append(f"{hf_key}: maps to {new}, as {renamed[new]} does already")
            continue
        renamed[new] = hf_key

    levels_with_two = {k.split("scale_layers.2.")[0] for k in renamed if ".scale_layers.2." in k}
    out: dict[str, np.ndarray] = {}
    for new, hf_key in renamed.items():
        target = _fpn_rename(new, levels_with_two)
        if ".scale_layers." in target:
            problems.append(f"{hf_key}: unexpected FPN scale layer")
            continue
        value = np.asarray(state[hf_key])
        if target == "backbone.vision_backbone.trunk.pos_embed":
            if value.ndim != 3:
                problems.append(f"{hf_key}: shape {list(value.shape)} is not 1 x N x C")
                continue
            value = np.concatenate([np.zeros_like(value[:, :1]), value], axis=1)
        elif target == "backbone.language_backbone.encoder.text_projection":
            if value.ndim != 2:
                problems.append(f"{hf_key}: shape {list(value.shape)} is not 2-D")
                continue
            value = value.T
        out[DETECTOR_PREFIX + target] = value
    for new, parts in fused.items():
        missing = [p for p in "qkv" if p not in parts]
        any_key = next(iter(parts.values()))
        if missing:
            problems.append(
                f"{any_key}: " + ", ".join(f"{p}_proj" for p in missing) + " missing beside it"
            )
            continue
        values = [np.asarray(state[parts[p]]) for p in "qkv"]
        if len({v.shape for v in values}) != 1 or len({v.dtype for v in values}) != 1:
            problems.append(
                f"{parts['q']}: q/k/v projections differ in shape or dtype "
                f"({', '.join(f'{list(v.shape)} {v.dtype}' for v in values)})"
            )
            continue
        out[DETECTOR_PREFIX + new] = np.concatenate(values, axis=0)
    if problems:
        raise CheckpointMismatchError(
            "cannot map the HF SAM 3 checkpoint:\n    "
            + "\n    ".join(problems[:20])
            + (f"\n    ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        )
    _fill_points(out)
    return out


def _fill_points(out: dict[str, np.ndarray]) -> None:
    """Add the geometry encoder's point projections (absent from HF): NaN (:data:`FILLED`)."""
    label = out.get(DETECTOR_PREFIX + "geometry_encoder.label_embed.weight")
    if label is None or label.ndim != 2:
        return  # the strict check will name what is missing
    d, dtype = label.shape[1], label.dtype
    fan_in = {"points_direct_project": 2, "points_pool_project": d, "points_pos_enc_project": d}
    for name, n_in in fan_in.items():
        prefix = f"{DETECTOR_PREFIX}geometry_encoder.{name}."
        out.setdefault(prefix + "weight", np.full((d, n_in), np.nan, dtype))
        out.setdefault(prefix + "bias", np.full((d,), np.nan, dtype))


def dropped_keys(keys: Iterable[str]) -> dict[str, str]:
    """``{HF key: reason}`` for the keys :func:`hf_to_released` deliberately leaves out."""
    return {k: r for k in keys if (r := unmapped_reason(k)) is not None}


def load_hf_state_dict(path: str | Path, progress: bool = False) -> dict[str, np.ndarray]:
    """Tensors of an HF checkpoint: a ``.safetensors`` file, a sharded checkpoint's
    ``model.safetensors.index.json``, or a folder holding either. Read without torch."""
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "model.safetensors.index.json"):
            if (path / name).is_file():
                return load_hf_state_dict(path / name, progress)
        raise CheckpointFormatError(
            f"{path} holds neither model.safetensors nor model.safetensors.index.json"
        )
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointFormatError(f"{path} is not a safetensors index: {exc}") from exc
        shards = sorted(set(weight_map.values()))
        state: dict[str, np.ndarray] = {}
        for shard in shards:
            shard_path = path.parent / shard
            if Path(shard).name != shard or not shard_path.is_file():
                raise CheckpointFormatError(f"{path}: shard {shard!r} not found beside it")
            part = load_state_dict(shard_path, progress=progress)
            wrong = [k for k in part if weight_map.get(k) != shard]
            if wrong:
                raise CheckpointFormatError(
                    f"{shard_path}: {wrong[0]} is not listed for this shard in {path.name}"
                )
            state.update(part)
        absent = sorted(set(weight_map) - set(state))
        if absent:
            raise CheckpointFormatError(
                f"{path}: {len(absent)} keys listed but not in their shard, e.g. {absent[0]}"
            )
        return state
    return load_state_dict(path, progress=progress)


def is_hf_source(path: str | Path) -> bool:
    """A folder or a sharded checkpoint's index: only HF ships SAM 3 that way."""
    path = Path(path)
    return path.is_dir() or path.name.endswith(".index.json")


def read_released(path: str | Path, progress: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """A SAM 3 checkpoint in the released layout, whatever its source layout: the state dict
    (HF files mapped by :func:`hf_to_released`) and ``{"layout": "official" | "hf",
    "dropped": {reason: number of keys}}``. Raises :class:`CheckpointMismatchError` for a file
    in neither layout."""
    from .sam3 import is_sam3_checkpoint

    path = Path(path)
    state = (
        load_hf_state_dict(path, progress)
        if is_hf_source(path)
        else load_state_dict(path, progress=progress)
    )
    if is_hf_sam3_layout(state):
        dropped: dict[str, int] = {}
        for reason in dropped_keys(state).values():
            dropped[reason] = dropped.get(reason, 0) + 1
        return hf_to_released(state), {"layout": "hf", "dropped": dropped}
    if not is_sam3_checkpoint(state):
        raise CheckpointMismatchError(
            f"{path} is not a SAM 3 checkpoint: no 'detector.backbone.*' keys (released "
            "sam3.pt) and no 'vision_encoder.backbone.*' keys (HF transformers)"
        )
    return state, {"layout": "official", "dropped": {}}
