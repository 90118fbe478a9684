"""Parity of the SAM 3 heads against the official sam3 modules (tiny configs, perturbed weights).

Geometry encoder, fusion encoder, decoder (box refinement, box bias, presence token),
dot-product scoring and segmentation head, each fed the same inputs as its reference.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import paddle
import pytest

from paddle_sam.models.sam3 import model_misc as M
from tests.helpers.sam3_ref import (
    assert_close,
    attention_path,
    cpu_patches,
    import_sam3,
    perturb_module_,
    threaded_attention,
)

torch, _ = import_sam3()

D, HEADS, FFN = 32, 4, 64


@pytest.fixture(autouse=True)
def _cpu():
    with cpu_patches():
        yield


def load_from_torch(layer: paddle.nn.Layer, module, skip_complex: bool = False) -> None:
    """Copy a torch module's weights into our layer: Linear weights transposed, fused
    ``in_proj`` of attention split into q/k/v; every key on both sides must be used (complex
    RoPE buffers, which our layers recompute, may be skipped)."""
    state = {
        k: v.detach().cpu().numpy()
        for k, v in module.state_dict().items()
        if not (skip_complex and v.is_complex())
    }
    subs = dict(layer.named_sublayers(include_self=True))
    used, new = set(), {}
    for name, param in layer.state_dict().items():
        owner, _, pname = name.rpartition(".")
        parent, _, proj = owner.rpartition(".")
        if proj in ("q_proj", "k_proj", "v_proj") and isinstance(
            subs.get(parent), M.MultiheadAttention
        ):
            i = ("q_proj", "k_proj", "v_proj").index(proj)
            key = f"{parent}.in_proj_{pname}".lstrip(".")
            d = subs[parent].embed_dim
            value = state[key][i * d : (i + 1) * d]
        else:
            key = name
            value = state[key]
        if isinstance(subs[owner], paddle.nn.Linear) and pname == "weight":
            value = value.T
        assert list(value.shape) == list(param.shape), f"{name}: {value.shape} vs {param.shape}"
        new[name] = paddle.to_tensor(np.ascontiguousarray(value))
        used.add(key)
    unused = set(state) - used
    assert not unused, f"reference keys not loaded: {sorted(unused)}"
    layer.set_state_dict(new)


def t2p(x) -> paddle.Tensor:
    return paddle.to_tensor(x.detach().cpu().numpy())


def randn(*shape, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("block", [None, 2 * HEADS * 7, "threads"])
def test_multihead_attention_masks(block, monkeypatch):
    """torch semantics for every mask kind; ``block`` forces the row-blocked path (2 query rows
    at a time) that large inputs take, or ("threads") those blocks shared between 3 threads
    as in dygraph inference on several CPU threads (where no gradient is wanted)."""
    threads = threaded_attention(monkeypatch) if block == "threads" else None
    if block is not None:
        monkeypatch.setattr(M, "_ATTN_BLOCK", 2 * HEADS * 7)
    grad = paddle.no_grad() if threads is not None else contextlib.nullcontext()
    for batch_first in (False, True):
        ref = perturb_module_(torch.nn.MultiheadAttention(D, HEADS, batch_first=batch_first))
        ref.eval()
        ours = M.MultiheadAttention(D, HEADS, batch_first=batch_first)
        load_from_torch(ours, ref)
        ours.eval()
        L, S, B = 5, 7, 2
        shapes = [(B, n, D) if batch_first else (n, B, D) for n in (L, S, S)]
        q, k, v = (randn(*s, seed=i) for i, s in enumerate(shapes))
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[1, 4:] = True
        masks = [
            {},
            {"key_padding_mask": kpm},
            {"attn_mask": randn(B * HEADS, L, S, seed=4), "key_padding_mask": kpm},
            {"attn_mask": torch.arange(S)[None, :] > torch.arange(L)[:, None]},
        ]
        for kw in masks:
            with torch.no_grad():
                r = ref(q, k, v, need_weights=False, **kw)[0]
            with grad:
                o = ours(t2p(q), t2p(k), t2p(v), **{n: t2p(m) for n, m in kw.items()})[0]
            assert_close(r, o, max_abs=1e-5, name=f"mha batch_first={batch_first} {list(kw)}")
    if threads is not None:  # 3 workers for every call (B x heads x 5 rows x 7 keys each)
        assert len(threads) == 3 * 2 * len(masks)
        assert all(name.startswith("paddle-sam-worker") for name in threads)


def test_dot_product_scoring_and_mlp():
    from sam3.model.model_misc import MLP, DotProductScoring

    ref = DotProductScoring(
        d_model=D,
        d_proj=D,
        prompt_mlp=MLP(D, FFN, D, 2, dropout=0.1, residual=True, out_norm=torch.nn.LayerNorm(D)),
    )
    perturb_module_(ref, scale=0.5).eval()
    ours = M.DotProductScoring(
        D, D, prompt_mlp=M.MLP(D, FFN, D, 2, 0.1, True, paddle.nn.LayerNorm(D))
    )
    load_from_torch(ours, ref)
    ours.eval()
    hs, prompt = randn(3, 2, 6, D, seed=1) * 3, randn(5, 2, D, seed=2)
    mask = torch.tensor([[False] * 5, [False, False, True, True, True]])
    with torch.no_grad():
        r = ref(hs, prompt, mask)
    o = ours(t2p(hs), t2p(prompt), t2p(mask))
    assert_close(r, o, name="dot product scores")
    x = torch.rand(5, 3)
    r_inv = __import__("sam3.model.model_misc", fromlist=["x"]).inverse_sigmoid(x)
    assert_close(r_inv, M.inverse_sigmoid(t2p(x)), name="inverse_sigmoid")


# ---- tiny builders: the official configuration with small sizes, on both sides ----


def ref_encoder_layer(batch_first: bool, pos_at_attn: bool, pos_keys: bool):
    from sam3.model.encoder import TransformerEncoderLayer
    from sam3.model.model_misc import MultiheadAttentionWrapper

    return TransformerEncoderLayer(
        activation="relu",
        d_model=D,
        dim_feedforward=FFN,
        dropout=0.1,
        pos_enc_at_attn=pos_at_attn,
        pos_enc_at_cross_attn_keys=pos_keys,
        pos_enc_at_cross_attn_queries=False,
        pre_norm=True,
        self_attention=MultiheadAttentionWrapper(D, HEADS, dropout=0.1, batch_first=batch_first),
        cross_attention=MultiheadAttentionWrapper(D, HEADS, dropout=0.1, batch_first=batch_first),
    )


def our_encoder_layer(batch_first: bool, pos_at_attn: bool, pos_keys: bool):
    from paddle_sam.models.sam3.encoder import TransformerEncoderLayer

    return TransformerEncoderLayer(
        activation="relu",
        d_model=D,
        dim_feedforward=FFN,
        dropout=0.1,
        pos_enc_at_attn=pos_at_attn,
        pos_enc_at_cross_attn_keys=pos_keys,
        pos_enc_at_cross_attn_queries=False,
        pre_norm=True,
        self_attention=M.MultiheadAttention(D, HEADS, dropout=0.1, batch_first=batch_first),
        cross_attention=M.MultiheadAttention(D, HEADS, dropout=0.1, batch_first=batch_first),
    )


def pair_eval(ref, ours, seed: int = 0, scale: float = 0.1):
    perturb_module_(ref, seed=seed, scale=scale).eval()
    load_from_torch(ours, ref)
    ours.eval()
    return ref, ours


H, W = 6, 5  # coarsest feature map of the tiny tests: HW = 30 tokens


@pytest.mark.parametrize("fused", [False, True], ids=["matmul-softmax", "fused-kernel"])
def test_fusion_encoder(fused, monkeypatch):
    """``fused``: the image self-attention through Paddle's fused CPU attention kernel, which
    the full-size encoder (5184 tokens) takes on CPUs with AVX-512."""
    from sam3.model.encoder import TransformerEncoderFusion as RefFusion

    from paddle_sam.models.sam3.encoder import TransformerEncoderFusion

    calls = attention_path(monkeypatch, fused)
    for add_pooled in (False, True):
        kw = dict(
            num_layers=2,
            d_model=D,
            num_feature_levels=1,
            add_pooled_text_to_img_feat=add_pooled,
            pool_text_with_mask=True,
        )
        ref, ours = pair_eval(
            RefFusion(layer=ref_encoder_layer(True, True, False), **kw),
            TransformerEncoderFusion(layer=our_encoder_layer(True, True, False), **kw),
        )
        src, pos = randn(H * W, 2, D, seed=1), randn(H * W, 2, D, seed=2)
        prompt = randn(7, 2, D, seed=3)
        pmask = torch.zeros(2, 7, dtype=torch.bool)
        pmask[0, 5:] = True
        args = dict(prompt_key_padding_mask=pmask, feat_sizes=[(H, W)])
        with torch.no_grad():
            r = ref(src=[src.clone()], src_pos=[pos.clone()], prompt=prompt, **args)
        with paddle.no_grad():  # as inference runs; with gradients the kernel is skipped
            o = ours(
                src=[t2p(src)],
                src_pos=[t2p(pos)],
                prompt=t2p(prompt),
                prompt_key_padding_mask=t2p(pmask),
                feat_sizes=[(H, W)],
            )
        assert_close(r["memory"], o["memory"], name=f"fusion memory (pooled={add_pooled})")
        assert_close(r["pos_embed"], o["pos_embed"], name="fusion pos")
        assert r["padding_mask"] is None and o["padding_mask"] is None
        np.testing.assert_array_equal(r["spatial_shapes"].numpy(), o["spatial_shapes"].numpy())
        np.testing.assert_array_equal(
            r["level_start_index"].numpy(), o["level_start_index"].numpy()
        )
    # the image self-attention of both layers in both runs; never the masked cross-attention
    assert calls == ([H * W] * 4 if fused else [])


def decoder_pair(num_queries: int = 10, num_layers: int = 3, boxrpb: str = "log"):
    from sam3.model.decoder import TransformerDecoder as RefDecoder
    from sam3.model.decoder import TransformerDecoderLayer as RefLayer
    from sam3.model.model_misc import MultiheadAttentionWrapper

    from paddle_sam.models.sam3.decoder import TransformerDecoder, TransformerDecoderLayer

    common = dict(activation="relu", d_model=D, dim_feedforward=FFN, dropout=0.1, n_heads=HEADS)
    dec = dict(
        num_layers=num_layers,
        num_queries=num_queries,
        return_intermediate=True,
        box_refine=True,
        num_o2m_queries=0,
        dac=True,
        boxRPB=boxrpb,
        d_model=D,
        frozen=False,
        interaction_layer=None,
        dac_use_selfatt_ln=True,
        resolution=H * 14,
        stride=14,
        presence_token=True,
    )
    ref = RefDecoder(
        layer=RefLayer(
            cross_attention=MultiheadAttentionWrapper(D, HEADS, dropout=0.1),
            use_text_cross_attention=True,
            **common,
        ),
        **dec,
    )
    ours = TransformerDecoder(
        layer=TransformerDecoderLayer(
            cross_attention=M.MultiheadAttention(D, HEADS, dropout=0.1),
            use_text_cross_attention=True,
            **common,
        ),
        **dec,
    )
    return pair_eval(ref, ours, scale=0.3)


@pytest.mark.parametrize("boxrpb", ["log", "linear", "both"])
def test_decoder(boxrpb):
    ref, ours = decoder_pair(boxrpb=boxrpb)
    bs, nq = 2, 10
    tgt = ref.query_embed.weight.detach()[:, None].repeat(1, bs, 1)
    memory, pos = randn(H * W, bs, D, seed=1), randn(H * W, bs, D, seed=2)
    text = randn(7, bs, D, seed=3)
    tmask = torch.zeros(bs, 7, dtype=torch.bool)
    tmask[1, 3:] = True
    shapes = torch.tensor([[H, W]])
    with torch.no_grad():
        r = ref(
            tgt=tgt,
            memory=memory,
            pos=pos,
            reference_boxes=None,
            level_start_index=torch.tensor([0]),
            spatial_shapes=shapes,
            valid_ratios=torch.ones(bs, 1, 2),
            tgt_mask=None,
            memory_text=text,
            text_attention_mask=tmask,
            apply_dac=False,
        )
    o = ours(
        tgt=t2p(tgt),
        memory=t2p(memory),
        pos=t2p(pos),
        spatial_shapes=t2p(shapes),
        valid_ratios=paddle.ones([bs, 1, 2]),
        memory_text=t2p(text),
        text_attention_mask=t2p(tmask),
    )
    assert o[0].shape == [3, nq, bs, D]
    names = ("hs", "ref boxes", "presence logits", "presence feats")
    for name, a, b in zip(names, r, o, strict=True):
        assert_close(a, b, name=f"decoder {name} ({boxrpb})")
    rpb_ref = ref._get_rpb_matrix(r[1][1], (H, W))
    rpb = ours._get_rpb_matrix(o[1][1], H, W)
    assert_close(rpb_ref, rpb, name="box relative-position bias")


@pytest.mark.parametrize("precomputed", [False, True], ids=["per-prompt", "image-terms"])
def test_segmentation_head(precomputed):
    """``precomputed``: the pixel decoder's convolutions of the image's own levels passed in
    (as ``Sam3Processor.set_image`` computes them), the upsampled part convolved per prompt
    at the coarse resolution; against the official head that does neither."""
    from sam3.model.maskformer_segmentation import PixelDecoder as RefPixel
    from sam3.model.maskformer_segmentation import UniversalSegmentationHead as RefHead
    from sam3.model.model_misc import MultiheadAttentionWrapper

    from paddle_sam.models.sam3.maskformer_segmentation import (
        PixelDecoder,
        UniversalSegmentationHead,
    )

    ref = RefHead(
        hidden_dim=D,
        upsampling_stages=2,
        aux_masks=False,
        presence_head=False,
        dot_product_scorer=None,
        act_ckpt=True,
        cross_attend_prompt=MultiheadAttentionWrapper(num_heads=HEADS, dropout=0, embed_dim=D),
        pixel_decoder=RefPixel(num_upsampling_stages=2, interpolation_mode="nearest", hidden_dim=D),
    )
    ours = UniversalSegmentationHead(
        hidden_dim=D,
        upsampling_stages=2,
        cross_attend_prompt=M.MultiheadAttention(D, HEADS, dropout=0),
        pixel_decoder=PixelDecoder(D, 2, interpolation_mode="nearest"),
    )
    ref, ours = pair_eval(ref, ours, scale=0.3)
    for bs in (1, 2):
        feats = [randn(bs, D, H * s, W * s, seed=s) for s in (4, 2, 1)]
        queries = randn(3, bs, 10, D, seed=7)
        enc = randn(H * W, bs, D, seed=8)
        prompt = randn(6, bs, D, seed=9)
        pmask = torch.zeros(bs, 6, dtype=torch.bool)
        pmask[-1, 4:] = True
        ids = torch.arange(bs)
        with torch.no_grad():
            r = ref(
                backbone_feats=feats,
                obj_queries=queries,
                image_ids=ids,
                encoder_hidden_states=enc,
                prompt=prompt,
                prompt_mask=pmask,
            )
        levels = [t2p(f) for f in feats]
        terms = ours.pixel_decoder.image_terms(levels) if precomputed else None
        o = ours(
            backbone_feats=levels,
            obj_queries=t2p(queries),
            image_ids=t2p(ids),
            encoder_hidden_states=t2p(enc),
            prompt=t2p(prompt),
            prompt_mask=t2p(pmask),
            image_terms=terms,
        )
        assert_close(r["pred_masks"], o["pred_masks"], max_abs=1e-3, name=f"masks bs={bs}")
        assert_close(r["semantic_seg"], o["semantic_seg"], max_abs=1e-3, name="semantic")


@pytest.mark.parametrize("shape", [(1, 8, 6, 5, 7), (2, 16, 16, 9, 4)])
def test_conv3x3_of_nearest_upsampling(shape):
    """The 3 x 3 convolution of a 2x nearest-upsampled map, computed at the coarse resolution,
    equals torch's convolution of the upsampled map (borders and odd sizes included)."""
    from paddle_sam.models.sam3.maskformer_segmentation import conv3x3_nearest_up2

    b, c, co, h, w = shape
    x, wt = randn(b, c, h, w, seed=1), randn(co, c, 3, 3, seed=2)
    up = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
    ref = torch.nn.functional.conv2d(up, wt, padding=1)
    # values up to ~40 here: 1e-4 is float rounding of a different summation order
    assert_close(ref, conv3x3_nearest_up2(t2p(x), t2p(wt)), max_abs=1e-4, name="conv of up2")


def test_roi_align_matches_torchvision():
    """paddle's roi_align with aligned=False equals torchvision's default (what sam3 uses)."""
    import torchvision
    from paddle.vision.ops import roi_align

    feats = randn(2, 3, H, W, seed=1)
    boxes = torch.tensor(
        [[[0.3, 0.2, 3.7, 4.1], [-1.0, -0.5, 2.0, 7.5]], [[1.0, 1.0, 1.2, 1.1], [0, 0, W, H]]]
    )
    r = torchvision.ops.roi_align(feats, list(boxes.unbind(0)), 7)
    o = roi_align(
        t2p(feats), t2p(boxes.reshape(-1, 4)), paddle.to_tensor([2, 2], "int32"), 7, aligned=False
    )
    assert_close(r, o, max_abs=1e-5, name="roi_align")


def geometry_pair():
    pe_mod = pytest.importorskip("paddle_sam.models.sam3.position_encoding")
    from sam3.model.geometry_encoders import SequenceGeometryEncoder as RefGeo
    from sam3.model.position_encoding import PositionEmbeddingSine as RefPE

    from paddle_sam.models.sam3.geometry_encoders import SequenceGeometryEncoder

    kw = dict(
        encode_boxes_as_points=False,
        points_direct_project=True,
        points_pool=True,
        points_pos_enc=True,
        boxes_direct_project=True,
        boxes_pool=True,
        boxes_pos_enc=True,
        d_model=D,
        num_layers=2,
        use_act_ckpt=True,
        add_cls=True,
        add_post_encode_proj=True,
    )
    ref = RefGeo(
        pos_enc=RefPE(num_pos_feats=D, normalize=True, scale=None, temperature=10000),
        layer=ref_encoder_layer(False, False, True),
        **kw,
    )
    ours = SequenceGeometryEncoder(
        pos_enc=pe_mod.PositionEmbeddingSine(
            num_pos_feats=D, normalize=True, scale=None, temperature=10000
        ),
        layer=our_encoder_layer(False, False, True),
        **kw,
    )
    return pair_eval(ref, ours, scale=0.3)


def test_geometry_encoder():
    from sam3.model.geometry_encoders import Prompt as RefPrompt

    from paddle_sam.models.sam3.geometry_encoders import Prompt

    ref, ours = geometry_pair()
    bs = 2
    feats, pos = randn(H * W, bs, D, seed=1), randn(H * W, bs, D, seed=2)
    boxes = torch.tensor(
        [[[0.5, 0.5, 0.4, 0.6], [0.3, 0.6, 0.2, 0.1]], [[0.7, 0.2, 0.3, 0.3], [0.1, 0.9, 0.5, 0.5]]]
    )  # N x B x 4, cx cy w h
    labels = torch.tensor([[1, 0], [0, 1]])
    bmask = torch.tensor([[False, False], [False, True]])  # second box of image 1 is padding
    points = torch.rand(3, bs, 2, generator=torch.Generator().manual_seed(3))
    plabels = torch.tensor([[1, 1], [0, 1], [1, 0]])
    pmask = torch.tensor([[False, False, False], [False, True, True]])
    cases = {
        "boxes": dict(box_embeddings=boxes, box_labels=labels, box_mask=bmask),
        "points+boxes": dict(
            box_embeddings=boxes,
            box_labels=labels,
            box_mask=bmask,
            point_embeddings=points,
            point_labels=plabels,
            point_mask=pmask,
        ),
        "no boxes": dict(box_embeddings=torch.zeros(0, bs, 4), box_mask=torch.zeros(bs, 0).bool()),
    }
    for name, prompt in cases.items():
        with torch.no_grad():
            r_emb, r_mask = ref(RefPrompt(**prompt), [feats], [(H, W)], [pos])
        o_emb, o_mask = ours(
            Prompt(**{k: t2p(v) for k, v in prompt.items()}), [t2p(feats)], [(H, W)], [t2p(pos)]
        )
        np.testing.assert_array_equal(r_mask.numpy(), o_mask.numpy())
        valid = ~r_mask.numpy().T  # N x B: padded tokens hold arbitrary values on both sides
        assert_close(r_emb.numpy()[valid], o_emb.numpy()[valid], name=f"geometry ({name})")


def test_prompt_append_boxes():
    from sam3.model.geometry_encoders import Prompt as RefPrompt

    from paddle_sam.models.sam3.geometry_encoders import Prompt

    r = RefPrompt(box_embeddings=torch.zeros(0, 1, 4), box_mask=torch.zeros(1, 0).bool())
    o = Prompt(box_embeddings=paddle.zeros([0, 1, 4]), box_mask=paddle.zeros([1, 0], "bool"))
    for i, label in enumerate((True, False, True)):
        box = torch.tensor([0.1 * i + 0.2, 0.5, 0.3, 0.2]).view(1, 1, 4)
        r.append_boxes(box, torch.tensor([label]).view(1, 1))
        o.append_boxes(t2p(box), paddle.to_tensor([label]).reshape([1, 1]))
    np.testing.assert_array_equal(r.box_embeddings.numpy(), o.box_embeddings.numpy())
    np.testing.assert_array_equal(r.box_labels.long().numpy(), o.box_labels.numpy())
    np.testing.assert_array_equal(r.box_mask.numpy(), o.box_mask.numpy())


@pytest.fixture(scope="module")
def interactive_pair():
    """The official tracker's SAM heads (released sizes: 72x72 embedding, 256 channels) and
    ours with the same perturbed weights, each inside its image predictor, holding the same
    random image features."""
    from sam3 import model_builder as mb
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor as RefPredictor

    from paddle_sam.models.sam3.interactive import SAM3InteractiveImagePredictor, Sam3TrackerHeads

    with cpu_patches():
        torch.manual_seed(0)
        tracker = mb.build_tracker(apply_temporal_disambiguation=False).eval()
        ref = RefPredictor(tracker)
    heads = Sam3TrackerHeads()
    for name in ("sam_prompt_encoder", "sam_mask_decoder"):
        perturb_module_(getattr(tracker, name), scale=0.05)
        load_from_torch(getattr(heads, name), getattr(tracker, name))
    with torch.no_grad():
        tracker.no_mem_embed.normal_(0, 0.1)
    heads.no_mem_embed.set_value(tracker.no_mem_embed.detach().numpy())
    ours = SAM3InteractiveImagePredictor(heads)
    ours.eval()
    # second-neck features as Sam3Processor.set_image leaves them (conv_s0/s1 applied)
    fpn = [randn(1, 256, s, s, seed=s) for s in (288, 144, 72)]
    pos = [randn(1, 256, s, s, seed=s + 1) for s in (288, 144, 72)]
    with torch.no_grad():
        fpn[0] = tracker.sam_mask_decoder.conv_s0(fpn[0])
        fpn[1] = tracker.sam_mask_decoder.conv_s1(fpn[1])
        _, feats, _, _ = tracker._prepare_backbone_features(
            {"backbone_fpn": fpn, "vision_pos_enc": pos}
        )
        feats[-1] = feats[-1] + tracker.no_mem_embed
        maps = [
            f.permute(1, 2, 0).view(1, -1, *size)
            for f, size in zip(feats, ref._bb_feat_sizes, strict=True)
        ]
    ref._features = {"image_embed": maps[-1], "high_res_feats": maps[:-1]}
    ref._orig_hw, ref._is_image_set = [(300, 420)], True
    ours.set_features(
        {"backbone_fpn": [t2p(f) for f in fpn], "vision_pos_enc": [t2p(p) for p in pos]},
        [(300, 420)],
    )
    return ref, ours


INTERACTIVE_CASES = {
    "one click, multimask": dict(point_coords=[[200.0, 150.0]], point_labels=[1]),
    "clicks, single mask": dict(
        point_coords=[[200.0, 150.0], [50.0, 60.0]], point_labels=[1, 0], multimask_output=False
    ),
    "box": dict(box=[100.0, 80.0, 300.0, 250.0], multimask_output=False),
    "box + click, logits": dict(
        box=[100.0, 80.0, 300.0, 250.0],
        point_coords=[[150.0, 120.0]],
        point_labels=[0],
        return_logits=True,
    ),
    "two boxes": dict(box=[[10.0, 10.0, 90.0, 200.0], [100.0, 80.0, 300.0, 250.0]]),
}


@pytest.mark.parametrize("case", list(INTERACTIVE_CASES))
def test_interactive_predictor(interactive_pair, case):
    ref, ours = interactive_pair
    kw = INTERACTIVE_CASES[case]
    with cpu_patches(), torch.no_grad(), warnings.catch_warnings():
        # holes are filled on both sides: upstream's CPU backend is scikit-image (test extra)
        warnings.simplefilter("error")
        r = ref.predict(**{k: np.asarray(v) if isinstance(v, list) else v for k, v in kw.items()})
    o = ours.predict(**kw)
    assert o[0].shape == r[0].shape and o[2].shape == r[2].shape
    assert_close(r[1], o[1], max_abs=1e-5, name=f"{case}: iou")
    assert_close(r[2], o[2], max_abs=1e-3, name=f"{case}: low-res logits")
    if kw.get("return_logits"):
        assert_close(r[0], o[0], max_abs=1e-3, name=f"{case}: masks")
    else:
        agree = (r[0] == o[0]).mean()
        assert agree >= 0.9999, f"{case}: binary masks agree on {agree:.6f}"
    with pytest.raises(RuntimeError, match="set_image"):
        type(ours)(ours.model).predict(point_coords=[[1.0, 1.0]], point_labels=[1])


@pytest.mark.parametrize("hole, sprinkle", [(256.0, 0.0), (0.0, 30.0), (40.0, 40.0)])
def test_hole_and_sprinkle_removal(interactive_pair, hole, sprinkle):
    """Small background holes and foreground sprinkles of predicted logits, removed as
    upstream does (its CPU backend: scikit-image's 8-connected labelling), on logits with
    components of many sizes, touching diagonally too."""
    ref, ours = interactive_pair
    rng = np.random.default_rng(7)
    blobs = rng.standard_normal((2, 3, 48, 40)).astype(np.float32)
    logits = np.where(rng.random((2, 3, 48, 40)) < 0.35, -np.abs(blobs), np.abs(blobs) + 0.1)
    ref._transforms.max_hole_area, ref._transforms.max_sprinkle_area = hole, sprinkle
    ours.max_hole_area, ours.max_sprinkle_area = hole, sprinkle
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")  # upstream skips with a warning without a backend
            r = ref._transforms.postprocess_masks(torch.from_numpy(logits), (48, 40)).numpy()
        o = ours._postprocess_masks(paddle.to_tensor(logits), (48, 40)).numpy()
    finally:
        ref._transforms.max_hole_area, ref._transforms.max_sprinkle_area = 256.0, 0.0
        ours.max_hole_area, ours.max_sprinkle_area = 256.0, 0.0
    changed = (r > 0) != (logits > 0)
    assert changed.any(), "the case must have components to remove"
    np.testing.assert_allclose(o, r, atol=1e-5)


def test_fused_attention_rules(monkeypatch):
    """When the fused CPU kernel is taken: equal lengths at or above the floor, no gradient
    wanted, float32 on the CPU, not switched off; never in a static graph unless asked."""
    monkeypatch.setattr(M, "fused_attention_available", lambda: True)
    floor = M.FUSED_ATTENTION_MIN_TOKENS
    x = paddle.zeros([2, 3])
    assert M.use_fused_attention(None, x, floor, floor)
    assert not M.use_fused_attention(False, x, floor, floor)  # switched off
    assert not M.use_fused_attention(None, x, floor - 1, floor - 1)  # too short
    assert not M.use_fused_attention(None, x, floor, floor + 1)  # cross-attention
    assert not M.use_fused_attention(None, x.astype("float64"), floor, floor)
    w = paddle.zeros([2, 3])
    w.stop_gradient = False
    assert not M.use_fused_attention(None, w * 2, floor, floor)  # training: no grad kernel
    with paddle.no_grad():
        assert M.use_fused_attention(None, w * 2, floor, floor)
    flag = "FLAGS_new_executor_serial_run"
    saved = paddle.get_flags([flag])[flag]
    try:  # the kernel would get one thread on the executor's worker thread
        paddle.set_flags({flag: False})
        assert not M.use_fused_attention(None, x, floor, floor)
    finally:
        paddle.set_flags({flag: saved})
    monkeypatch.setattr(M, "fused_attention_available", lambda: False)
    assert not M.use_fused_attention(None, x, floor, floor)
