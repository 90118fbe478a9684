"""Per-module alignment of our SAM 3 against the official code (``sam3``, facebookresearch).

Both image models get the same image and prompts through their ``Sam3Processor``: the vision
trunk (block by block) and neck on ``set_image``; then a text prompt and a text + box prompt
through the text encoder, the geometry (prompt) encoder, the detector's transformer encoder
and decoder, the segmentation head and the scoring. With the tracker's SAM heads (the released
``sam3.pt``), SAM's click cases go through ``predict_inst``; with the whole tracker, the image's
features go through ``track_step`` as a still video (a click on frame 0, tracking after):
memory encoder, memory attention layer by layer, object-pointer projection and the SAM heads
again. Every module is scored as in :mod:`.common`.

The official code assumes CUDA in a few places; :func:`cpu_patches` makes it run on the CPU
inside a ``with`` block, touching nothing outside it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..models.sam3.build_sam3 import SAM3_SPEC, TRACKER_SETTINGS, Sam3Spec
from ..predict.sam3.tokenizer import DEFAULT_BPE_PATH
from .common import (
    Alignment,
    AlignReport,
    click_cases,
    default_image,
    load_official,
    numpy_state_dict,
    perturb_torch_,
    run_click_cases,
    submodule,
)
from .sam2 import track_still_video

DETECTOR_MODULES = (
    "backbone.vision_backbone.trunk.blocks.*",
    "backbone.vision_backbone.trunk",
    "backbone.vision_backbone",
    "backbone.language_backbone",
    "geometry_encoder",
    "transformer.encoder",
    "transformer.decoder",
    "segmentation_head",
    "dot_prod_scoring",
)
# the tracker's modules, by their names in the released checkpoint (``tracker.*``)
HEAD_MODULES = ("tracker.sam_prompt_encoder", "tracker.sam_mask_decoder")
MEMORY_MODULES = (
    "tracker.obj_ptr_proj",
    "tracker.maskmem_backbone",
    "tracker.transformer.encoder.layers.*",
    "tracker.transformer.encoder",
)
DETECTOR_PREFIX = "detector."
TRACKER_PREFIX = "tracker."
SECOND_NECK = "backbone.vision_backbone.sam2_convs."
# upstream's image model holds the tracker under this name (its checkpoint loader's mapping)
REF_TRACKER = "inst_interactive_predictor.model."


def import_sam3() -> tuple[Any, Any]:
    """``(torch, sam3)`` or an ImportError that says how to install them."""
    try:
        import sam3
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the official SAM 3 reference is not installed; it is a test-only extra: "
            "pip install 'paddle-sam[torch]' (torch==2.14.1, sam3)"
        ) from exc
    return torch, sam3


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Run the official sam3 code on the CPU inside the block: its sine position encoding's
    precomputed cache and its decoder's box-RPB coordinates are made on the CPU instead of
    ``"cuda"``, and ``Tensor.pin_memory`` / ``Tensor.cuda`` (the tracker moves stored
    memories to CUDA) return the tensor itself."""
    from unittest import mock

    torch, _ = import_sam3()
    from sam3.model import decoder, position_encoding

    pe_cls = position_encoding.PositionEmbeddingSine
    pe_init = pe_cls.__init__

    def pe_init_cpu(self, *args: Any, precompute_resolution: int | None = None, **kw: Any):
        pe_init(self, *args, precompute_resolution=None, **kw)
        if precompute_resolution is not None:  # the same values, computed on the CPU
            for stride in (4, 8, 16, 32):
                size = (precompute_resolution // stride, precompute_resolution // stride)
                self.forward(torch.zeros((1, 1, *size)))
                self.cache[size] = self.cache[size].clone().detach()

    get_coords = decoder.TransformerDecoder._get_coords

    def get_coords_cpu(h: int, w: int, device: Any):
        return get_coords(h, w, "cpu" if str(device).startswith("cuda") else device)

    def itself(self, *args: Any, **kwargs: Any):
        return self

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(pe_cls, "__init__", pe_init_cpu))
        stack.enter_context(
            mock.patch.object(
                decoder.TransformerDecoder, "_get_coords", staticmethod(get_coords_cpu)
            )
        )
        stack.enter_context(mock.patch.object(torch.Tensor, "pin_memory", itself))
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", itself))
        yield


def reference_vision_backbone(spec: Sam3Spec, add_sam2_neck: bool) -> Any:
    """Upstream's ViT and dual neck (``model_builder``'s configuration) at ``spec``'s sizes; the
    neck carries the SAM 2-style branch for the tracker when ``add_sam2_neck``."""
    from sam3.model.necks import Sam3DualViTDetNeck
    from sam3.model.position_encoding import PositionEmbeddingSine
    from sam3.model.vitdet import ViT

    trunk = ViT(
        img_size=spec.image_size,
        pretrain_img_size=spec.pretrain_image_size,
        patch_size=spec.vit_patch_size,
        embed_dim=spec.encoder_embed_dim,
        depth=spec.encoder_depth,
        num_heads=spec.encoder_num_heads,
        mlp_ratio=spec.mlp_ratio,
        norm_layer="LayerNorm",
        drop_path_rate=0.1,
        qkv_bias=True,
        use_abs_pos=True,
        tile_abs_pos=True,
        global_att_blocks=spec.encoder_global_attn_indexes,
        rel_pos_blocks=(),
        use_rope=True,
        use_interp_rope=True,
        window_size=spec.window_size,
        pretrain_use_cls_token=True,
        retain_cls_token=False,
        ln_pre=True,
        ln_post=False,
        return_interm_layers=False,
        bias_patch_embed=False,
    )
    pe = PositionEmbeddingSine(
        spec.d_model, normalize=True, temperature=10000, precompute_resolution=spec.image_size
    )
    return Sam3DualViTDetNeck(
        position_encoding=pe,
        d_model=spec.d_model,
        scale_factors=list(spec.scale_factors),
        trunk=trunk,
        add_sam2_neck=add_sam2_neck,
    )


def reduced_reference(spec: Sam3Spec, bpe_path: str, interactive: bool):
    """Upstream's ``Sam3Image`` with ``model_builder``'s configuration at ``spec``'s sizes
    (upstream's builder writes the released sizes), with the tracker of
    ``model_builder.build_tracker`` as its interactive predictor when ``interactive``."""
    torch, _ = import_sam3()
    from sam3 import model_builder as mb
    from sam3.model import memory as m
    from sam3.model.decoder import TransformerDecoder, TransformerDecoderLayer
    from sam3.model.encoder import TransformerEncoderFusion, TransformerEncoderLayer
    from sam3.model.geometry_encoders import SequenceGeometryEncoder
    from sam3.model.maskformer_segmentation import PixelDecoder, UniversalSegmentationHead
    from sam3.model.model_misc import MLP, DotProductScoring, TransformerWrapper
    from sam3.model.model_misc import MultiheadAttentionWrapper as MHA
    from sam3.model.position_encoding import PositionEmbeddingSine
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor
    from sam3.model.sam3_tracking_predictor import Sam3TrackerPredictor
    from sam3.model.text_encoder_ve import VETextEncoder
    from sam3.model.tokenizer_ve import SimpleTokenizer
    from sam3.model.vl_combiner import SAM3VLBackbone

    d, nh, ffn = spec.d_model, spec.num_heads, spec.dim_feedforward
    neck = reference_vision_backbone(spec, add_sam2_neck=interactive)
    text = VETextEncoder(
        tokenizer=SimpleTokenizer(bpe_path=bpe_path),
        d_model=d,
        width=spec.text_width,
        heads=spec.text_heads,
        layers=spec.text_layers,
        context_length=spec.context_length,
        vocab_size=spec.vocab_size,
    )
    # built in this order (the random initial weights follow it)
    backbone = SAM3VLBackbone(visual=neck, text=text, scalp=spec.scalp)

    def enc_layer(batch_first: bool, pos_at_attn: bool, pos_keys: bool):
        return TransformerEncoderLayer(
            activation="relu",
            d_model=d,
            dim_feedforward=ffn,
            dropout=0.1,
            pos_enc_at_attn=pos_at_attn,
            pos_enc_at_cross_attn_keys=pos_keys,
            pos_enc_at_cross_attn_queries=False,
            pre_norm=True,
            self_attention=MHA(num_heads=nh, dropout=0.1, embed_dim=d, batch_first=batch_first),
            cross_attention=MHA(num_heads=nh, dropout=0.1, embed_dim=d, batch_first=batch_first),
        )

    encoder = TransformerEncoderFusion(
        layer=enc_layer(True, True, False),
        num_layers=spec.encoder_layers,
        d_model=d,
        num_feature_levels=1,
        frozen=False,
        use_act_checkpoint=True,
        add_pooled_text_to_img_feat=False,
        pool_text_with_mask=True,
    )
    decoder = TransformerDecoder(
        layer=TransformerDecoderLayer(
            activation="relu",
            d_model=d,
            dim_feedforward=ffn,
            dropout=0.1,
            cross_attention=MHA(num_heads=nh, dropout=0.1, embed_dim=d),
            n_heads=nh,
            use_text_cross_attention=True,
        ),
        num_layers=spec.decoder_layers,
        num_queries=spec.num_queries,
        return_intermediate=True,
        box_refine=True,
        num_o2m_queries=0,
        dac=True,
        boxRPB="log",
        d_model=d,
        frozen=False,
        interaction_layer=None,
        dac_use_selfatt_ln=True,
        resolution=spec.image_size,
        stride=spec.vit_patch_size,
        use_act_checkpoint=True,
        presence_token=True,
    )
    transformer = TransformerWrapper(encoder=encoder, decoder=decoder, d_model=d)
    scoring = DotProductScoring(
        d_model=d,
        d_proj=d,
        prompt_mlp=MLP(d, ffn, d, 2, dropout=0.1, residual=True, out_norm=torch.nn.LayerNorm(d)),
    )
    seg = UniversalSegmentationHead(
        hidden_dim=d,
        upsampling_stages=spec.upsampling_stages,
        aux_masks=False,
        presence_head=False,
        dot_product_scorer=None,
        act_ckpt=True,
        cross_attend_prompt=MHA(num_heads=nh, dropout=0, embed_dim=d),
        pixel_decoder=PixelDecoder(
            num_upsampling_stages=spec.upsampling_stages, interpolation_mode="nearest", hidden_dim=d
        ),
    )
    geo = SequenceGeometryEncoder(
        pos_enc=PositionEmbeddingSine(d, normalize=True, temperature=10000),
        encode_boxes_as_points=False,
        points_direct_project=True,
        points_pool=True,
        points_pos_enc=True,
        boxes_direct_project=True,
        boxes_pool=True,
        boxes_pos_enc=True,
        d_model=d,
        num_layers=spec.geometry_layers,
        layer=enc_layer(False, False, True),
        use_act_ckpt=True,
        add_cls=True,
        add_post_encode_proj=True,
    )
    inst = None
    if interactive:
        side = spec.image_size // spec.vit_patch_size
        maskmem = m.SimpleMaskEncoder(
            out_dim=64,
            position_encoding=PositionEmbeddingSine(
                num_pos_feats=64, normalize=True, scale=None, temperature=10000
            ),
            mask_downsampler=m.SimpleMaskDownSampler(
                kernel_size=3, stride=2, padding=1, interpol_size=[16 * side, 16 * side]
            ),
            fuser=m.SimpleFuser(
                layer=m.CXBlock(
                    dim=256, kernel_size=7, padding=3, layer_scale_init_value=1e-6, use_dwconv=True
                ),
                num_layers=2,
            ),
        )
        # its RoPE tables are for 72 x 72 features; the attention recomputes them for others
        tracker = Sam3TrackerPredictor(
            backbone=None,
            transformer=mb._create_tracker_transformer(),
            maskmem_backbone=maskmem,
            image_size=spec.image_size,
            backbone_stride=spec.vit_patch_size,
            forward_backbone_per_frame_for_eval=True,
            trim_past_non_cond_mem_for_eval=False,
            offload_output_to_cpu_for_eval=False,
            use_memory_selection=False,
            **TRACKER_SETTINGS,
        )
        inst = SAM3InteractiveImagePredictor(tracker)
    return mb._create_sam3_model(backbone, transformer, geo, seg, scoring, inst, eval_mode=True)


def build_reference_sam3(
    spec: Sam3Spec = SAM3_SPEC,
    interactive: bool = True,
    checkpoint: str | Path | None = None,
    bpe_path: str | Path | None = None,
):
    """Upstream's SAM 3 image model of ``spec`` on the CPU, in eval mode (build it and run it
    inside :func:`cpu_patches`). The released sizes are built by upstream's own
    ``build_sam3_image_model``; other sizes with its configuration at ``spec``'s sizes.
    ``interactive``: with the tracker (SAM heads, memory encoder, memory attention) as its
    interactive predictor, as upstream builds it for ``enable_inst_interactivity``.
    ``checkpoint``: the released ``sam3.pt`` loaded strictly (``torch.load`` with
    ``weights_only=True``; ``detector.*`` into the image model, ``tracker.*`` into the
    tracker); random weights without it."""
    import_sam3()
    from sam3.model_builder import build_sam3_image_model

    bpe = str(bpe_path or DEFAULT_BPE_PATH)
    if interactive and spec.d_model != 256:
        raise ValueError(f"SAM 3's tracker needs d_model 256, the spec has {spec.d_model}")
    if spec == SAM3_SPEC:
        ref = build_sam3_image_model(
            bpe_path=bpe,
            device="cpu",
            checkpoint_path=None,
            load_from_HF=False,
            enable_inst_interactivity=interactive,
        )
    else:
        ref = reduced_reference(spec, bpe, interactive)
    if interactive:  # upstream hard-codes the released feature sizes (288, 144, 72)
        side = spec.image_size // spec.vit_patch_size
        ref.inst_interactive_predictor._bb_feat_sizes = [
            (4 * side,) * 2,
            (2 * side,) * 2,
            (side,) * 2,
        ]
    if checkpoint is not None:
        load_official(ref, checkpoint, lambda state: released_to_reference(state, interactive))
    return ref.eval()


def released_to_reference(state: dict, interactive: bool) -> dict:
    """Released ``sam3.pt`` keys -> upstream image model's (what its own loader maps). Without
    ``interactive`` the tracker and the second (SAM 2) neck it feeds are left out, as the
    model built without instance interactivity has neither (upstream's loader skips them by
    loading non-strictly)."""
    out = {}
    for key, value in state.items():
        if key.startswith(DETECTOR_PREFIX):
            name = key[len(DETECTOR_PREFIX) :]
            if interactive or not name.startswith(SECOND_NECK):
                out[name] = value
        elif key.startswith(TRACKER_PREFIX) and interactive:
            out[REF_TRACKER + key[len(TRACKER_PREFIX) :]] = value
    return out


def reference_to_released(ref) -> dict[str, np.ndarray]:
    """Upstream image model's state dict in the released ``sam3.pt`` layout (numpy)."""
    out = {}
    for key, value in numpy_state_dict(ref).items():
        if key.startswith(REF_TRACKER):
            out[TRACKER_PREFIX + key[len(REF_TRACKER) :]] = value
        else:
            out[DETECTOR_PREFIX + key] = value
    return out


def randomise_(ref, seed: int = 0, scale: float = 0.1, obj_bias: float = 6.0):
    """Weights for a random-weights alignment: every tensor finite and perturbed (none at a
    trivial 0 or 1; the text encoder's two ``torch.empty`` tensors drawn), and with the tracker
    its object-score head's bias at ``obj_bias``, so that both sides' object-present
    decisions are clear of 0. Returns ``ref``."""
    torch, _ = import_sam3()
    perturb_torch_(ref, seed, scale)
    if ref.inst_interactive_predictor is not None:
        heads = ref.inst_interactive_predictor.model.sam_mask_decoder
        with torch.no_grad():
            heads.pred_obj_score_head.layers[-1].bias.fill_(obj_bias)
    return ref.eval()


def converted_models(ref, spec: Sam3Spec, bpe_path: str | Path | None = None) -> tuple[Any, Any]:
    """Our image model of ``spec`` and (when ``ref`` has the tracker) our tracker, with
    ``ref``'s weights through our converter (its released layout first): ``(image model,
    tracker or None)``."""
    from ..convert import sam3 as conv
    from ..convert.core import load_state_strict, model_shapes
    from ..models.sam3.build_sam3 import build_sam3_model, build_tracker_model
    from ..predict.sam3.tokenizer import SimpleTokenizer

    interactive = ref.inst_interactive_predictor is not None
    converted = conv.convert_state_dict(reference_to_released(ref))
    ours = build_sam3_model(
        spec, tokenizer=SimpleTokenizer(bpe_path=bpe_path), enable_inst_interactivity=interactive
    )
    load_state_strict(ours, conv.select_for_model(converted, model_shapes(ours)))
    tracker = None
    if interactive:
        tracker = build_tracker_model(spec)
        load_state_strict(tracker, conv.tracker_state(converted))
    return ours, tracker


def random_pair(
    spec: Sam3Spec = SAM3_SPEC,
    interactive: bool = True,
    seed: int = 0,
    bpe_path: str | Path | None = None,
) -> tuple[Any, Any, Any]:
    """(upstream image model, our image model, our tracker or None) of ``spec`` with the same
    random weights (:func:`randomise_`)."""
    torch, _ = import_sam3()
    torch.manual_seed(seed)
    with cpu_patches():
        ref = randomise_(build_reference_sam3(spec, interactive, bpe_path=bpe_path), seed)
    return (ref, *converted_models(ref, spec, bpe_path))


def module_pairs(ref, ours, tracker=None) -> list[tuple[str, Any, Any]]:
    """``(name, upstream module, ours)`` compared for these models: the detector's always,
    the tracker's SAM heads when both image models hold them (and ``tracker``'s too), the
    memory modules when ``tracker`` is given."""
    counts = {
        "backbone.vision_backbone.trunk.blocks.*": len(ours.backbone.vision_backbone.trunk.blocks),
    }
    out = []
    for n in DETECTOR_MODULES:
        names = [f"{n[:-2]}.{i}" for i in range(counts[n])] if n.endswith(".*") else [n]
        out += [(m, submodule(ref, m), submodule(ours, m)) for m in names]
    ref_inst = ref.inst_interactive_predictor
    our_inst = ours.inst_interactive_predictor
    if ref_inst is None:
        return out
    theirs = ref_inst.model
    for n in HEAD_MODULES:
        name = n[len(TRACKER_PREFIX) :]
        mine = [submodule(m, name) for m in (our_inst and our_inst.model, tracker) if m]
        if mine:
            out.append((n, submodule(theirs, name), mine))
    if tracker is not None:
        for n in MEMORY_MODULES:
            name = n[len(TRACKER_PREFIX) :]
            if n.endswith(".*"):
                count = len(submodule(tracker, name[:-2]))
                names = [f"{name[:-2]}.{i}" for i in range(count)]
            else:
                names = [name]
            out += [
                (TRACKER_PREFIX + m, submodule(theirs, m), submodule(tracker, m)) for m in names
            ]
    return out


def align_sam3(
    ref,
    ours,
    tracker=None,
    image: np.ndarray | None = None,
    text: str = "object",
    box: tuple[float, float, float, float] = (0.4, 0.45, 0.5, 0.55),
    cases: list[tuple[str, dict[str, Any]]] | None = None,
    frames: int = 3,
    confidence_threshold: float = 0.5,
) -> AlignReport:
    """Compare upstream's SAM 3 image model (``ref``) and ours (``ours``, with ``tracker``:
    our video tracker, for the memory modules) module by module on ``image`` (a fixed
    synthetic one by default): the text prompt ``text``, then ``box`` (cx, cy, w, h in [0, 1])
    added; with the tracker's heads the click ``cases`` (:func:`~.common.click_cases`)
    through ``predict_inst``; with ``tracker`` and upstream's tracker ``frames`` tracking
    steps (0: none) over the image as a still video."""
    torch, _ = import_sam3()
    from PIL import Image
    from sam3.model.sam3_image_processor import Sam3Processor as RefProcessor

    from ..predict.sam3.processor import Sam3Processor

    image = default_image() if image is None else image
    h, w = image.shape[:2]
    picture = Image.fromarray(image)  # upstream's processor reads sizes from PIL or CHW only
    size = ours.spec.image_size
    interactive = ref.inst_interactive_predictor is not None
    interactive = interactive and ours.inst_interactive_predictor is not None
    video = frames > 0 and tracker is not None and ref.inst_interactive_predictor is not None
    with cpu_patches(), Alignment(module_pairs(ref, ours, tracker if video else None)) as al:
        theirs = RefProcessor(ref, resolution=size, device="cpu")
        mine = Sam3Processor(ours, resolution=size)
        for processor in (theirs, mine):
            processor.confidence_threshold = confidence_threshold
        with al.stage():
            with torch.no_grad():
                ref_state = theirs.set_image(picture)
            our_state = mine.set_image(picture)
        steps = [
            ("text", lambda p, s: p.set_text_prompt(text, s)),
            ("text+box", lambda p, s: p.add_geometric_prompt(list(box), True, s)),
        ]
        for name, step in steps:
            with al.stage(f"[{name}] "):
                with torch.no_grad():
                    step(theirs, ref_state)
                step(mine, our_state)
            for key in ("scores", "boxes", "masks_logits"):
                al.output(f"[{name}] {key}", ref_state[key], our_state[key])
            al.output(f"[{name}] masks", ref_state["masks"], our_state["masks"])
        if interactive:
            run_click_cases(
                al,
                functools.partial(ref.predict_inst, ref_state),
                functools.partial(ours.predict_inst, our_state),
                click_cases(h, w) if cases is None else cases,
                tag="inst ",
            )
        if video:
            ref_tracker = ref.inst_interactive_predictor.model
            with torch.no_grad():
                _, *ref_features = ref_tracker._prepare_backbone_features(
                    ref_state["backbone_out"]["sam2_backbone_out"]
                )
            _, *our_features = tracker._prepare_backbone_features(
                our_state["backbone_out"]["sam2_backbone_out"]
            )
            click = np.array([0.4 * w, 0.45 * h]) / [w, h] * size
            track_still_video(
                al, ref_tracker, tracker, ref_features, our_features, click, frames, {"image": None}
            )
    al.report.meta.update(
        family="sam3",
        image_size=[h, w],
        text=text,
        box=list(box),
        clicks=interactive,
        frames=frames if video else 0,
    )
    return al.report


__all__ = [
    "DETECTOR_MODULES",
    "HEAD_MODULES",
    "MEMORY_MODULES",
    "align_sam3",
    "build_reference_sam3",
    "converted_models",
    "cpu_patches",
    "random_pair",
    "randomise_",
    "reduced_reference",
    "reference_vision_backbone",
]
