"""SAM 3 backbone parity against the official sam3 modules, reduced configs.

ViT trunk (windowed + global attention, RoPE, tiled abs pos), sine position encoding, dual
FPN neck, causal text encoder and the vision-language combiner: each built at a tiny size in
both frameworks with the same perturbed random weights (converted by our converter), run on
the same inputs, compared by cosine and max abs error.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

pytest.importorskip("torch")
pytest.importorskip("sam3")

import torch  # noqa: E402

from paddle_sam.convert.sam3 import convert_tensors  # noqa: E402
from paddle_sam.convert.sam_v1 import check_keys  # noqa: E402
from paddle_sam.models.sam3.necks import Sam3DualViTDetNeck  # noqa: E402
from paddle_sam.models.sam3.position_encoding import PositionEmbeddingSine  # noqa: E402
from paddle_sam.models.sam3.text_encoder import VETextEncoder  # noqa: E402
from paddle_sam.models.sam3.vitdet import (
    # noqa: E402
    ViT,
    apply_rope,
    axial_rope_angles,
    rope_tables,
)
from paddle_sam.models.sam3.vl_combiner import SAM3VLBackbone  # noqa: E402
from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH, SimpleTokenizer  # noqa: E402
from tests.helpers.sam3_ref import (  # noqa: E402
    assert_close,
    attention_path,
    cpu_patches,
    fan_in_init_,
    numpy_state_dict,
    perturb_module_,
    threaded_attention,
)

# window 4 tiles the 8x8 grid; window 3 pads it to 9x9; pretraining grid 4x4 (+cls) is tiled
VIT_TINY = dict(
    img_size=112,
    patch_size=14,
    embed_dim=64,
    depth=4,
    num_heads=4,
    mlp_ratio=4.625,
    global_att_blocks=(1, 3),
    window_size=4,
    pretrain_img_size=56,
)
VIT_PAD = dict(VIT_TINY, window_size=3, global_att_blocks=(2,), depth=3, pretrain_img_size=42)
TEXT_TINY = dict(d_model=32, width=64, heads=4, layers=2, context_length=16)
CAPTIONS = ["a dog", "yellow school bus", "the cat on the mat, sleeping"]


@pytest.fixture(autouse=True)
def _cpu_reference():
    torch.manual_seed(0)
    with cpu_patches():
        yield


def _ref_vit(**kw):
    from sam3.model.vitdet import ViT as RefViT

    args = dict(
        qkv_bias=True,
        norm_layer="LayerNorm",
        drop_path_rate=0.0,
        use_abs_pos=True,
        tile_abs_pos=True,
        rel_pos_blocks=(),
        use_rope=True,
        use_interp_rope=True,
        pretrain_use_cls_token=True,
        retain_cls_token=False,
        ln_pre=True,
        ln_post=False,
        return_interm_layers=False,
        bias_patch_embed=False,
        compile_mode=None,
        use_act_checkpoint=False,
    )
    args.update(kw)
    return RefViT(**args).eval()


def randomize(ref: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Unit-variance projections (peaked attention, so RoPE and masks matter), then every
    tensor perturbed and made finite."""
    return perturb_module_(fan_in_init_(ref, seed), seed=seed)


def load_from(ours: paddle.nn.Layer, ref: torch.nn.Module) -> dict[str, np.ndarray]:
    """Copy ``ref``'s weights into ``ours`` through the converter, strictly."""
    state = convert_tensors(numpy_state_dict(ref))
    check_keys({k: tuple(v.shape) for k, v in ours.state_dict().items()}, state)
    ours.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    ours.eval()
    return state


def _image(size: int, batch: int = 2, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (batch, 3, size, size)).astype(np.float32)


def test_rope_matches_complex_form():
    from sam3.model.vitdet import apply_rotary_enc, compute_axial_cis

    for end, scale in ((4, 1.0), (8, 0.5)):
        cis = compute_axial_cis(dim=16, end_x=end, end_y=end, scale_pos=scale)
        angles = axial_rope_angles(16, end, end, scale_pos=scale)
        np.testing.assert_allclose(np.cos(angles), cis.real.numpy(), atol=1e-6)
        np.testing.assert_allclose(np.sin(angles), cis.imag.numpy(), atol=1e-6)
        q = torch.randn(2, 3, end * end, 16)
        k = torch.randn(2, 3, end * end, 16)
        rq, rk = apply_rotary_enc(q, k, cis)
        cos, sin, swap = (paddle.to_tensor(t) for t in rope_tables(angles))
        assert_close(rq, apply_rope(paddle.to_tensor(q.numpy()), cos, sin, swap), max_abs=1e-5)
        assert_close(rk, apply_rope(paddle.to_tensor(k.numpy()), cos, sin, swap), max_abs=1e-5)


@pytest.mark.parametrize(
    "block", [None, 1600, "fused"], ids=["one-block", "row-blocks", "fused-kernel"]
)
@pytest.mark.parametrize("cfg", [VIT_TINY, VIT_PAD], ids=["tiled-windows", "padded-windows"])
def test_vit_trunk(cfg, block, monkeypatch):
    """``block`` forces the query-row-blocked attention that the full-size global blocks take
    (2-3 query rows at a time here, the last block shorter; on the calling thread, even where
    other attentions share their rows between threads), or Paddle's fused CPU attention
    kernel that attentions over at least FUSED_ATTENTION_MIN_TOKENS take on CPUs with AVX-512."""
    calls = attention_path(monkeypatch, fused=block == "fused")
    threads = threaded_attention(monkeypatch)
    if isinstance(block, int):
        from paddle_sam.models.sam3 import vitdet

        monkeypatch.setattr(vitdet, "_ATTN_BLOCK", block)
    ref = randomize(_ref_vit(**cfg), seed=1)
    ours = ViT(**cfg, drop_path_rate=0.0)
    load_from(ours, ref)
    x = _image(cfg["img_size"])
    with torch.no_grad():
        (r,) = ref(torch.from_numpy(x))
    with paddle.no_grad():  # as inference runs; with gradients the kernel is skipped
        (o,) = ours(paddle.to_tensor(x))
    assert_close(r, o, max_abs=1e-4, name="trunk")
    assert len(calls) == (cfg["depth"] if block == "fused" else 0)  # every block, or none
    assert all(name == "MainThread" for name in threads)


def test_vit_intermediate_layers():
    cfg = dict(VIT_TINY, return_interm_layers=True)
    ref = randomize(_ref_vit(**cfg), seed=2)
    ours = ViT(**cfg)
    load_from(ours, ref)
    x = _image(112, batch=1, seed=3)
    with torch.no_grad():
        refs = ref(torch.from_numpy(x))
    outs = ours(paddle.to_tensor(x))
    assert len(outs) == len(refs) == 2
    for r, o in zip(refs, outs, strict=True):
        assert_close(r, o, max_abs=1e-4)


def test_position_encoding():
    from sam3.model.position_encoding import PositionEmbeddingSine as Ref

    ref, ours = Ref(64, precompute_resolution=112), PositionEmbeddingSine(64)
    for h, w in ((28, 28), (7, 9), (1, 1)):
        x = torch.zeros(2, 5, h, w)
        assert_close(ref(x), ours(paddle.zeros([2, 5, h, w])), max_abs=1e-5, name=f"{h}x{w}")
    xs, ys, ws, hs = (torch.rand(6) for _ in range(4))
    p = [paddle.to_tensor(t.numpy()) for t in (xs, ys, ws, hs)]
    assert_close(ref.encode_boxes(xs, ys, ws, hs), ours.encode_boxes(*p), max_abs=1e-5)
    px, py, lab = torch.rand(2, 3), torch.rand(2, 3), torch.randint(0, 2, (2, 3)).float()
    got = ours.encode_points(*(paddle.to_tensor(t.numpy()) for t in (px, py, lab)))
    assert_close(ref.encode_points(px, py, lab), got, max_abs=1e-5)
    unnormalised = Ref(32, normalize=False), PositionEmbeddingSine(32, normalize=False)
    assert_close(
        unnormalised[0](torch.zeros(1, 1, 5, 6)), unnormalised[1](paddle.zeros([1, 1, 5, 6]))
    )


def _neck_pair(add_sam2_neck: bool, seed: int):
    from sam3.model.necks import Sam3DualViTDetNeck as RefNeck
    from sam3.model.position_encoding import PositionEmbeddingSine as RefPE

    ref = RefNeck(
        trunk=_ref_vit(**VIT_TINY),
        position_encoding=RefPE(32, precompute_resolution=112),
        d_model=32,
        scale_factors=[4.0, 2.0, 1.0, 0.5],
        add_sam2_neck=add_sam2_neck,
    ).eval()
    randomize(ref, seed)
    ours = Sam3DualViTDetNeck(
        trunk=ViT(**VIT_TINY),
        position_encoding=PositionEmbeddingSine(32),
        d_model=32,
        add_sam2_neck=add_sam2_neck,
    )
    load_from(ours, ref)
    return ref, ours


@pytest.mark.parametrize("add_sam2_neck", [True, False])
def test_dual_neck(add_sam2_neck):
    ref, ours = _neck_pair(add_sam2_neck, seed=4)
    x = _image(112, seed=5)
    with torch.no_grad():
        r = ref(torch.from_numpy(x))
    o = ours(paddle.to_tensor(x))
    for group in range(4 if add_sam2_neck else 2):
        assert len(r[group]) == len(o[group]) == 4
        for level, (a, b) in enumerate(zip(r[group], o[group], strict=True)):
            assert_close(a, b, max_abs=1e-4, name=f"output {group} level {level}")
    if not add_sam2_neck:
        assert o[2] is None and o[3] is None


def _text_pair(seed: int):
    from sam3.model.text_encoder_ve import VETextEncoder as RefText
    from sam3.model.tokenizer_ve import SimpleTokenizer as RefTok

    ref = RefText(
        tokenizer=RefTok(bpe_path=str(DEFAULT_BPE_PATH)), use_act_checkpoint=False, **TEXT_TINY
    )
    randomize(ref.eval(), seed)
    ours = VETextEncoder(tokenizer=SimpleTokenizer(), **TEXT_TINY)
    load_from(ours, ref)
    return ref, ours


def test_text_encoder():
    ref, ours = _text_pair(seed=6)
    with torch.no_grad():
        r_mask, r_mem, r_emb = ref(CAPTIONS, device="cpu")
        _, r_tokens = ref.encoder(ref.tokenizer(CAPTIONS, context_length=16))
    o_mask, o_mem, o_emb = ours(CAPTIONS)
    np.testing.assert_array_equal(o_mask.numpy(), r_mask.numpy())
    assert_close(r_mem, o_mem, max_abs=1e-4, name="memory")
    assert_close(r_emb, o_emb, max_abs=1e-6, name="embeds")
    _, o_tokens = ours.encoder(paddle.to_tensor(ours.tokenizer(CAPTIONS, 16)))
    assert_close(r_tokens, o_tokens, max_abs=1e-4, name="tokens")


def test_text_transformer_pooling_and_projection():
    from sam3.model.text_encoder_ve import TextTransformer as RefTT

    from paddle_sam.models.sam3.text_encoder import TextTransformer

    kw = dict(context_length=12, vocab_size=100, width=32, heads=2, layers=2, output_dim=24)
    ids = np.array([[5, 9, 99, 0, 0], [7, 99, 0, 0, 0]], dtype=np.int64)
    for pool_type, proj_bias in (("argmax", False), ("first", True), ("last", False)):
        ref = RefTT(pool_type=pool_type, proj_bias=proj_bias, output_tokens=True, **kw).eval()
        randomize(ref, seed=7)
        ours = TextTransformer(pool_type=pool_type, proj_bias=proj_bias, output_tokens=True, **kw)
        load_from(ours, ref)
        with torch.no_grad():
            r_pooled, r_tokens = ref(torch.from_numpy(ids))
        o_pooled, o_tokens = ours(paddle.to_tensor(ids))
        assert_close(r_pooled, o_pooled, max_abs=1e-4, name=f"{pool_type} pooled")
        assert_close(r_tokens, o_tokens, max_abs=1e-4, name=f"{pool_type} tokens")


def test_vl_backbone():
    from sam3.model.vl_combiner import SAM3VLBackbone as RefVL

    ref_neck, our_neck = _neck_pair(True, seed=8)
    ref_text, our_text = _text_pair(seed=9)
    ref = RefVL(visual=ref_neck, text=ref_text, scalp=1).eval()
    ours = SAM3VLBackbone(visual=our_neck, text=our_text, scalp=1)
    x = _image(112, batch=1, seed=10)
    extra = ["a red car"]
    with torch.no_grad():
        r = ref(torch.from_numpy(x), CAPTIONS[:2], additional_text=extra)
    o = ours(paddle.to_tensor(x), CAPTIONS[:2], additional_text=extra)
    assert set(o) == set(r)
    assert len(o["backbone_fpn"]) == len(r["backbone_fpn"]) == 3
    assert_close(r["vision_features"], o["vision_features"], max_abs=1e-4)
    for a, b in zip(
        r["backbone_fpn"] + r["vision_pos_enc"],
        o["backbone_fpn"] + o["vision_pos_enc"],
        strict=True,
    ):
        assert_close(a, b, max_abs=1e-4)
    rs, os_ = r["sam2_backbone_out"], o["sam2_backbone_out"]
    assert_close(rs["vision_features"], os_["vision_features"], max_abs=1e-4)
    for key in ("language_features", "language_embeds", "additional_text_features"):
        assert_close(r[key], o[key], max_abs=1e-4, name=key)
    for key in ("language_mask", "additional_text_mask"):
        np.testing.assert_array_equal(o[key].numpy(), r[key].numpy())


def test_bad_inputs():
    vit = ViT(**VIT_TINY)
    with pytest.raises(ValueError, match="B x C x H x W"):
        vit(paddle.zeros([3, 112, 112]))
    with pytest.raises(ValueError, match="RoPE tables are for 64 tokens"):
        vit(paddle.zeros([1, 3, 140, 140]))
    with pytest.raises(NotImplementedError, match="rel_pos_blocks"):
        ViT(**dict(VIT_TINY, rel_pos_blocks=(1,)))
    with pytest.raises(ValueError, match="global_att_blocks"):
        ViT(**dict(VIT_TINY, global_att_blocks=(4,)))
    with pytest.raises(ValueError, match="scale factor 3.0"):
        Sam3DualViTDetNeck(vit, PositionEmbeddingSine(32), 32, scale_factors=(3.0,))
    text = VETextEncoder(tokenizer=None, **TEXT_TINY)
    with pytest.raises(ValueError, match="no tokenizer"):
        text(["a dog"])
    with pytest.raises(TypeError, match="list of strings"):
        text("a dog")
    with pytest.raises(ValueError, match="exceed the context length"):
        text.encoder(paddle.zeros([1, 17], dtype="int64"))
