"""SAM 3 tokenizer: identical token ids to the official sam3 SimpleTokenizer."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from paddle_sam.predict.sam3.tokenizer import DEFAULT_BPE_PATH, SimpleTokenizer

TRICKY = [
    "",
    "   ",
    "a dog",
    "yellow school bus",
    "A Yellow SCHOOL Bus",
    "  extra   white\tspace\n\nand\r\nlines  ",
    "don't they're we've I'm you'll he'd it's",
    "DON'T IT'S",
    "punctuation!!! ?? ... ,,, (brackets) [x] {y} <z>",
    "hyphen-ated and under_score and slash/word",
    "numbers 12345 and 3.14159 and 1,000,000",
    "café naïve résumé Ångström crème brûlée",
    "cafe\u0301 (combining accent, NFC by ftfy)",
    "Straße ǅ ß ẞ İstanbul",
    "日本語のテキスト 中文 한국어",
    "Ελληνικά русский עברית العربية हिन्दी ไทย",
    "emoji 🐶🐱 👨‍👩‍👧 🏳️‍🌈 ❤️ 👍🏽",
    "&amp; &lt;tag&gt; &quot;quoted&quot; &#39;x&#39; &amp;amp;",
    "html <b>bold</b> &nbsp; x",
    "mojibake: cafÃ© â€œquotedâ€\x9d",
    "curly “quotes” ‘single’ — dash … ellipsis",
    "ﬁne ligatures ﬂ and ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "superscripts x² and fractions ½ ⅓ and roman Ⅻ",
    "tabs\tand\x0bvertical\x0cfeed\u00a0nbsp\u2003emspace\u3000ideo",
    "control \x1c\x1d\x1e\x1f chars and zero\u200bwidth",
    "<start_of_text> in the text <end_of_text>",
    "mixed12abc34 a1b2 1a",
    "'s alone 's",
    "x" * 300,
    " ".join(["word"] * 100),
    "the quick brown fox jumps over the lazy dog " * 10,
]


@pytest.fixture(scope="module")
def official():
    pytest.importorskip("torch")
    pytest.importorskip("sam3")
    from sam3.model.tokenizer_ve import SimpleTokenizer as Ref

    return Ref(bpe_path=str(DEFAULT_BPE_PATH))


@pytest.fixture(scope="module")
def ours():
    return SimpleTokenizer()


@pytest.mark.parametrize("context_length", [32, 77])
def test_ids_match_official(official, ours, context_length):
    ref = official(TRICKY, context_length=context_length).numpy()
    got = ours(TRICKY, context_length=context_length)
    assert got.dtype == np.int64 and got.shape == ref.shape
    for text, r, g in zip(TRICKY, ref, got, strict=True):
        np.testing.assert_array_equal(g, r, err_msg=repr(text))


def test_encode_and_truncation_match(official, ours):
    for text in TRICKY:
        assert ours.encode(text) == official.encode(text), repr(text)
    ids = ours(["x" * 300], context_length=32)[0]
    assert ids[0] == ours.sot_token_id and ids[-1] == ours.eot_token_id and (ids != 0).all()


def test_random_unicode_strings_match(official, ours):
    rng = np.random.default_rng(0)
    pools = [
        (0x20, 0x7F),
        (0xA0, 0x250),
        (0x370, 0x500),
        (0x2000, 0x2070),
        (0x3000, 0x3100),
        (0x4E00, 0x4E80),
        (0x1F300, 0x1F680),
    ]
    texts = []
    for _ in range(60):
        n = int(rng.integers(1, 40))
        chars = []
        for _ in range(n):
            lo, hi = pools[int(rng.integers(len(pools)))]
            chars.append(chr(int(rng.integers(lo, hi))))
        texts.append("".join(chars))
    np.testing.assert_array_equal(ours(texts, 40), official(texts, context_length=40).numpy())


def test_special_ids_and_decode(ours):
    assert ours.vocab_size == 49408
    assert (ours.sot_token_id, ours.eot_token_id) == (49406, 49407)
    assert ours.decode(ours.encode("a yellow school bus")).strip() == "a yellow school bus"
    row = ours("")[0]
    assert row[:2].tolist() == [49406, 49407] and not row[2:].any()


def test_bad_inputs(tmp_path, ours):
    with pytest.raises(FileNotFoundError, match="BPE vocabulary not found"):
        SimpleTokenizer(tmp_path / "missing.txt.gz")
    plain = tmp_path / "plain.txt.gz"
    plain.write_text("not gzip")
    with pytest.raises(ValueError, match="not a gzip-compressed"):
        SimpleTokenizer(plain)
    short = tmp_path / "short.txt.gz"
    with gzip.open(short, "wt") as f:
        f.write("#version\ni n\nt h\n")
    with pytest.raises(ValueError, match="expected 48894 merge lines"):
        SimpleTokenizer(short)
    with pytest.raises(ValueError, match="clean must be one of"):
        SimpleTokenizer(clean="upper")
    with pytest.raises(TypeError, match="string or a list of strings"):
        ours([1, 2])
    with pytest.raises(ValueError, match="context_length"):
        ours("a", context_length=1)
