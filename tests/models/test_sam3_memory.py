"""Parity of the SAM 3 tracker's memory encoder and memory attention against the official sam3
modules (small configs and the released one, perturbed weights), and their state-dict keys
against the released checkpoint's ``tracker.maskmem_backbone.*`` / ``tracker.transformer.
encoder.*`` rows."""

from __future__ import annotations

import ast

import numpy as np
import paddle
import pytest

from paddle_sam.models.sam3 import memory as PM
from paddle_sam.models.sam3 import memory_attention as PA
from paddle_sam.models.sam3.position_encoding import PositionEmbeddingSine
from tests.helpers.sam3_ref import (
    assert_close,
    cpu_patches,
    fan_in_init_,
    import_sam3,
    perturb_module_,
    threaded_attention,
)
from tests.models.test_sam3_heads import load_from_torch, randn, t2p

torch, _ = import_sam3()


@pytest.fixture(autouse=True)
def _cpu():
    torch.manual_seed(0)  # upstream's initial weights, which the perturbation starts from
    with cpu_patches():
        yield


def _scaled_max_abs(ref, rel: float = 1e-5) -> float:
    """Error bar: ``rel`` times the reference's largest magnitude (at least 1)."""
    return rel * max(1.0, float(ref.detach().abs().max()))


# ---------------------------------------------------------------- memory encoder


@pytest.mark.parametrize(("size_in", "size_out"), [(36, 40), (20, 48), (48, 20), (37, 16), (8, 8)])
def test_antialias_resize_matches_torch(size_in, size_out):
    x = randn(2, 1, size_in, size_in + 3, seed=1)
    ref = torch.nn.functional.interpolate(
        x, size=[size_out, size_out], mode="bilinear", align_corners=False, antialias=True
    )
    ours = PM.resize_antialias(t2p(x), [size_out, size_out])
    assert_close(ref, ours, max_abs=2e-6, name=f"resize {size_in}->{size_out}")


def _small_mask_encoder(interpol_size, in_dim=32, out_dim=16):
    from sam3.model import memory as M
    from sam3.model.position_encoding import PositionEmbeddingSine as RefPE

    def build(mod, pe_cls):
        ds = mod.SimpleMaskDownSampler(
            embed_dim=in_dim,
            kernel_size=3,
            stride=2,
            padding=1,
            total_stride=4,
            interpol_size=interpol_size,
        )
        cx = mod.CXBlock(dim=in_dim, kernel_size=7, padding=3, layer_scale_init_value=1e-6)
        fuser = mod.SimpleFuser(layer=cx, num_layers=2, dim=in_dim, input_projection=True)
        pe = pe_cls(num_pos_feats=out_dim, normalize=True, scale=None, temperature=10000)
        return mod.SimpleMaskEncoder(
            out_dim=out_dim, mask_downsampler=ds, fuser=fuser, position_encoding=pe, in_dim=in_dim
        )

    ref = perturb_module_(build(M, RefPE), scale=0.5).eval()
    ours = build(PM, PositionEmbeddingSine)
    load_from_torch(ours, ref)
    ours.eval()
    return ref, ours


@pytest.mark.parametrize(
    ("interpol_size", "mask_size"), [([40, 40], 36), ([40, 40], 56), ([40, 40], 40), (None, 40)]
)
@pytest.mark.parametrize("skip_sigmoid", [False, True])
def test_mask_encoder_small(interpol_size, mask_size, skip_sigmoid):
    ref, ours = _small_mask_encoder(interpol_size)
    pix = randn(2, 32, 10, 10, seed=2)
    masks = randn(2, 1, mask_size, mask_size, seed=3) * 4
    with torch.no_grad():
        r = ref(pix, masks, skip_mask_sigmoid=skip_sigmoid)
    o = ours(t2p(pix), t2p(masks), skip_mask_sigmoid=skip_sigmoid)
    feats = r["vision_features"]
    assert_close(feats, o["vision_features"], max_abs=_scaled_max_abs(feats), name="features")
    assert_close(r["vision_pos_enc"][0], o["vision_pos_enc"][0], max_abs=1e-5, name="pos")


# ---------------------------------------------------------------- memory attention


def _rope_pair(**kw):
    from sam3.sam.transformer import RoPEAttention

    ref = RoPEAttention(**kw)
    fan_in_init_(perturb_module_(ref, scale=0.5), gain=2.0).eval()
    ours = PA.RoPEAttention(**kw)
    load_from_torch(ours, ref, skip_complex=True)
    ours.eval()
    return ref, ours


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize(
    ("n_side", "n_mem", "n_ptr"), [(4, 1, 0), (4, 3, 0), (4, 3, 4), (6, 2, 3), (4, 0, 4)]
)
def test_rope_cross_attention(n_side, n_mem, n_ptr, heads):
    """Keys: ``n_mem`` grids of the query size (RoPE repeated), then ``n_ptr`` pointer tokens
    without RoPE; ``n_side`` 6 makes both sides recompute their tables (built for 4 x 4).
    One head (the released trackers') projects the values after the attention."""
    kw = dict(
        embedding_dim=32,
        num_heads=heads,
        downsample_rate=1,
        dropout=0.1,
        kv_in_dim=16,
        rope_theta=10000.0,
        feat_sizes=[4, 4],
        rope_k_repeat=True,
    )
    ref, ours = _rope_pair(**kw)
    n_q = n_side * n_side
    q = randn(2, n_q, 32, seed=4)
    k = randn(2, n_mem * n_q + n_ptr, 16, seed=5)
    v = randn(2, n_mem * n_q + n_ptr, 16, seed=6)
    with torch.no_grad():
        r = ref(q, k, v, num_k_exclude_rope=n_ptr)
    o = ours(t2p(q), t2p(k), t2p(v), num_k_exclude_rope=n_ptr)
    assert_close(r, o, max_abs=_scaled_max_abs(r), name="rope cross-attention")


def _v_proj_rows(layer) -> list[int]:
    rows: list[int] = []
    layer.v_proj.register_forward_pre_hook(lambda _m, args: rows.append(int(args[0].shape[-2])))
    return rows


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_values_projected_after_attention(training):
    """One head, keys narrower than the attention: ``v_proj`` runs on the attended rows (one
    per query) in inference, the same values as projecting every memory first; with dropout
    on the weights (training) every memory is projected first, as upstream."""
    kw = dict(embedding_dim=32, num_heads=1, dropout=0.1, kv_in_dim=8, feat_sizes=[4, 4])
    ours = PA.RoPEAttention(rope_k_repeat=True, **kw)
    plain = PA.RoPEAttention(rope_k_repeat=True, **kw)
    plain.set_state_dict(ours.state_dict())
    plain._fold_values = lambda *a: False
    q, k, v = (paddle.randn(s) for s in ([2, 16, 32], [2, 3 * 16 + 2, 8], [2, 3 * 16 + 2, 8]))
    rows = _v_proj_rows(ours)
    ours.train(training)
    plain.train(training)
    paddle.seed(3)
    o = ours(q, k, v, num_k_exclude_rope=2)
    paddle.seed(3)
    p = plain(q, k, v, num_k_exclude_rope=2)
    assert rows == [50 if training else 16]
    np.testing.assert_allclose(o.numpy(), p.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_rope_self_attention(fused, monkeypatch):
    from paddle_sam.models.sam3 import model_misc

    if fused and not model_misc.fused_attention_available():
        pytest.skip("Paddle's fused CPU attention needs AVX-512F and its kernel")
    monkeypatch.setattr(model_misc, "FUSED_ATTENTION_MIN_TOKENS", 1 if fused else 10**9)
    kw = dict(embedding_dim=32, num_heads=2, downsample_rate=2, feat_sizes=[5, 5])
    ref, ours = _rope_pair(**kw)
    x = randn(3, 25, 32, seed=7)
    with torch.no_grad():
        r = ref(x, x, x)
    o = ours(t2p(x), t2p(x), t2p(x))
    assert_close(r, o, max_abs=_scaled_max_abs(r), name=f"rope self-attention fused={fused}")


@pytest.mark.parametrize("threads", [False, True], ids=["one-thread", "threads"])
def test_row_blocked_attention(threads, monkeypatch):
    """The query-row blocks large inputs take (forced to 3 rows here), on the calling thread
    or shared between 3 threads as in dygraph inference on several CPU threads."""
    from paddle_sam.models.sam3 import model_misc

    names = threaded_attention(monkeypatch) if threads else []

    kw = dict(embedding_dim=32, num_heads=2, kv_in_dim=16, feat_sizes=[4, 4], rope_k_repeat=True)
    ref, ours = _rope_pair(**kw)
    q, k = randn(1, 16, 32, seed=8), randn(1, 2 * 16 + 2, 16, seed=9)
    monkeypatch.setattr(model_misc, "_ATTN_BLOCK", 3 * 2 * k.shape[1])
    with torch.no_grad():
        r = ref(q, k, k, num_k_exclude_rope=2)
    with paddle.no_grad():
        o = ours(t2p(q), t2p(k), t2p(k), num_k_exclude_rope=2)
    assert_close(r, o, max_abs=_scaled_max_abs(r), name="row-blocked")
    assert len(names) == (3 if threads else 0)


def _small_encoder(mod_attn, mod_layer, d=32, kv=16, heads=2, side=4, **enc_kw):
    attn = dict(embedding_dim=d, num_heads=heads, downsample_rate=1, dropout=0.1)
    attn.update(rope_theta=10000.0, feat_sizes=[side, side])
    layer = mod_layer.TransformerDecoderLayerv2(
        cross_attention_first=enc_kw.pop("cross_attention_first", False),
        activation="relu",
        dim_feedforward=2 * d,
        dropout=0.1,
        pos_enc_at_attn=enc_kw.pop("pos_enc_at_attn", False),
        pre_norm=True,
        self_attention=mod_attn.RoPEAttention(**attn),
        d_model=d,
        pos_enc_at_cross_attn_keys=True,
        pos_enc_at_cross_attn_queries=enc_kw.pop("pos_enc_at_cross_attn_queries", False),
        cross_attention=mod_attn.RoPEAttention(**attn, kv_in_dim=kv, rope_k_repeat=True),
    )
    return mod_layer.TransformerEncoderCrossAttention(
        d_model=d,
        frozen=False,
        pos_enc_at_input=True,
        layer=layer,
        num_layers=enc_kw.pop("num_layers", 2),
        batch_first=True,
        **enc_kw,
    )


def _encoder_inputs(side, n_mem, n_ptr, d, kv, batch=2, seed=10):
    n = side * side
    src = randn(n, batch, d, seed=seed)
    src_pos = randn(n, batch, d, seed=seed + 1)
    prompt = randn(n_mem * n + n_ptr, batch, kv, seed=seed + 2)
    prompt_pos = randn(n_mem * n + n_ptr, batch, kv, seed=seed + 3)
    return src, src_pos, prompt, prompt_pos


def _run_encoder(ref, ours, inputs, n_ptr, as_list=False):
    src, src_pos, prompt, prompt_pos = inputs
    kw = dict(num_obj_ptr_tokens=n_ptr)
    with torch.no_grad():
        if as_list:
            r = ref(
                [src],
                prompt,
                src_key_padding_mask=[None],
                src_pos=[src_pos],
                **kw,
                prompt_pos=prompt_pos,
            )
        else:
            r = ref(src, prompt, src_pos=src_pos, prompt_pos=prompt_pos, **kw)
    p = [t2p(t) for t in inputs]
    if as_list:
        o = ours([p[0]], p[2], src_key_padding_mask=[None], src_pos=[p[1]], prompt_pos=p[3], **kw)
    else:
        o = ours(p[0], p[2], src_pos=p[1], prompt_pos=p[3], **kw)
    return r, o


@pytest.mark.parametrize(
    ("variant", "n_mem", "n_ptr"),
    [
        ({}, 2, 4),
        ({}, 1, 0),
        ({"cross_attention_first": True, "pos_enc_at_attn": True}, 3, 2),
        ({"pos_enc_at_cross_attn_queries": True, "remove_cross_attention_layers": [1]}, 2, 4),
        ({"num_layers": 3}, 2, 4),
    ],
)
def test_memory_attention_small(variant, n_mem, n_ptr):
    from sam3.model import decoder as RD
    from sam3.sam import transformer as RT

    ref = _small_encoder(RT, RD, **dict(variant))
    fan_in_init_(perturb_module_(ref, scale=0.5), gain=1.5).eval()
    ours = _small_encoder(PA, PA, **dict(variant))
    load_from_torch(ours, ref, skip_complex=True)
    ours.eval()
    inputs = _encoder_inputs(4, n_mem, n_ptr, 32, 16)
    r, o = _run_encoder(ref, ours, inputs, n_ptr, as_list=bool(variant))
    m = r["memory"]
    assert_close(m, o["memory"], max_abs=_scaled_max_abs(m), name="memory")
    assert_close(r["pos_embed"], o["pos_embed"], max_abs=0.0, name="pos_embed")
    assert o["padding_mask"] is None


def test_decoder_layer_v1_post_norm():
    """The v1 layer (MultiheadAttention call, post-norm), base of v2."""
    from sam3.model import decoder as RD

    from paddle_sam.models.sam3.model_misc import MultiheadAttention

    def build(mha, mod):
        return mod.TransformerDecoderLayerv1(
            activation="relu",
            cross_attention=mha(32, 4, dropout=0.1),
            d_model=32,
            dim_feedforward=64,
            dropout=0.1,
            pos_enc_at_attn=True,
            pos_enc_at_cross_attn_keys=True,
            pos_enc_at_cross_attn_queries=True,
            pre_norm=False,
            self_attention=mha(32, 4, dropout=0.1),
        )

    ref = fan_in_init_(perturb_module_(build(torch.nn.MultiheadAttention, RD), scale=0.5)).eval()
    ours = build(MultiheadAttention, PA)
    load_from_torch(ours, ref)
    ours.eval()
    tgt, qpos = randn(9, 2, 32, seed=20), randn(9, 2, 32, seed=21)
    mem, pos = randn(11, 2, 32, seed=22), randn(11, 2, 32, seed=23)
    with torch.no_grad():
        r = ref(tgt, mem, pos=pos, query_pos=qpos)
    o = ours(t2p(tgt), t2p(mem), pos=t2p(pos), query_pos=t2p(qpos))
    assert_close(r, o, max_abs=_scaled_max_abs(r), name="v1 post-norm")


# ---------------------------------------------------------------- released configuration


@pytest.fixture(scope="module")
def released():
    """Upstream's released tracker memory encoder and memory attention (perturbed) and ours
    with the same weights."""
    torch.manual_seed(0)
    with cpu_patches():
        from sam3 import model_builder as mb

        ref_mem = perturb_module_(mb._create_tracker_maskmem_backbone(), seed=1, scale=0.5)
        ref_enc = mb._create_tracker_transformer().encoder
        fan_in_init_(perturb_module_(ref_enc, seed=2, scale=0.5), gain=1.5)
    ours_mem = PM.build_tracker_maskmem_backbone()
    ours_enc = PA.build_tracker_memory_attention()
    load_from_torch(ours_mem, ref_mem.eval())
    load_from_torch(ours_enc, ref_enc.eval(), skip_complex=True)
    return ref_mem, ours_mem.eval(), ref_enc, ours_enc.eval()


def test_released_mask_encoder(released):
    """1008 px mask logits (resized to 1152, antialiased) and 72 x 72 x 256 features."""
    ref, ours = released[:2]
    pix = randn(1, 256, 72, 72, seed=30)
    masks = randn(1, 1, 1008, 1008, seed=31) * 8
    with torch.no_grad():
        r = ref(pix, masks)
    o = ours(t2p(pix), t2p(masks))
    feats = r["vision_features"]
    assert list(feats.shape) == [1, 64, 72, 72]
    c, m, _ = assert_close(feats, o["vision_features"], max_abs=_scaled_max_abs(feats))
    print(f"released mask encoder: cos {c:.9f} max abs {m:.3e} (|ref| max {feats.abs().max():.2f})")
    assert_close(r["vision_pos_enc"][0], o["vision_pos_enc"][0], max_abs=1e-5, name="pos")


def test_released_memory_attention(released):
    """72 x 72 frame tokens against two frames of memories plus pointer tokens (~13 s)."""
    ref, ours = released[2:]
    n_ptr = 8  # two object pointers of 256 split into 4 tokens of 64 each
    inputs = _encoder_inputs(72, 2, n_ptr, 256, 64, batch=1, seed=40)
    r, o = _run_encoder(ref, ours, inputs, n_ptr, as_list=True)
    m = r["memory"]
    # 3e-5 relative: four layers of peaked softmax over 10376 keys; torch's own float32 output
    # differs from its float64 run by 1.1e-4 here (1.1e-5 relative), ours by 1.2e-4
    c, e, _ = assert_close(m, o["memory"], max_abs=_scaled_max_abs(m, 3e-5), name="memory")
    print(f"released memory attention: cos {c:.9f} max abs {e:.3e} (|ref| max {m.abs().max():.2f})")


# ---------------------------------------------------------------- state-dict keys


def _torch_layout(layer: paddle.nn.Layer) -> dict[str, list[int]]:
    """Our state dict's keys and shapes in torch's layout (Linear weights transposed)."""
    subs = dict(layer.named_sublayers(include_self=True))
    out = {}
    for name, p in layer.state_dict().items():
        owner, _, pname = name.rpartition(".")
        shape = list(p.shape)
        if isinstance(subs[owner], paddle.nn.Linear) and pname == "weight":
            shape = shape[::-1]
        out[name] = shape
    return out


def test_state_dict_keys_match_checkpoint(released, reference_dir):
    ref_mem, ours_mem, ref_enc, ours_enc = released
    rows = (reference_dir / "sam3_checkpoint_keys.tsv").read_text().splitlines()[1:]
    ckpt = {r.split("\t")[0]: ast.literal_eval(r.split("\t")[1]) for r in rows}
    for prefix, ref, ours in (
        ("tracker.maskmem_backbone.", ref_mem, ours_mem),
        ("tracker.transformer.encoder.", ref_enc, ours_enc),
    ):
        expected = {k[len(prefix) :]: v for k, v in ckpt.items() if k.startswith(prefix)}
        ours_shapes = _torch_layout(ours)
        assert ours_shapes == expected, prefix
        ref_shapes = {k: list(v.shape) for k, v in ref.state_dict().items() if not v.is_complex()}
        assert ours_shapes == ref_shapes, prefix


def test_rope_tables_not_persistent():
    layer = PA.RoPEAttention(embedding_dim=32, num_heads=1, feat_sizes=[4, 4])
    assert not any("rope" in k for k in layer.state_dict())
    assert np.isfinite(layer.rope_cos.numpy()).all()
