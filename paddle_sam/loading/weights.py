"""The official checkpoints this project reads: where each is published, its checksum, and a
verified, resumable download (``paddle-sam download NAME``).

Checksums are full sha256 digests of the files as published. Where they come from differs, and
each entry says so in ``checksum_from``:

- SAM v1: Meta publishes no checksum. The six hex digits in the file names
  (``sam_vit_b_01ec64.pth``) are a prefix of a digest of Meta's, not of the sha256
  (``ec2df6...`` for ViT-B), so they verify nothing here; the sha256 below is the one recorded
  independently by several projects that downloaded the files.
- SAM 3: the sha256 of ``sam3.pt`` in the Hugging Face repository ``facebook/sam3`` (its LFS
  record; revision ``3c879f3``), also recorded independently. The repository is gated: a token
  of an account that accepted the licence is needed. The ungated mirror ``1038lab/sam3`` serves
  the same file; it is verified against the same sha256, so a mirror that changed it is refused.
- SAM 2 / 2.1: Meta publishes no checksum; the sha256 are independent records (several agree for
  ``sam2.1_hiera_tiny``, one record for the others).

Downloads go to ``FILE.part`` first and resume from there (HTTP ``Range``); the file gets its
final name only once its sha256 matches. A token is sent only to the host it is for
(``huggingface.co``), never to the host a redirect leads to (the hub redirects to its storage).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HF = "https://huggingface.co"
SAM_V1_URL = "https://dl.fbaipublicfiles.com/segment_anything"
SAM2_URL = "https://dl.fbaipublicfiles.com/segment_anything_2"
INDEPENDENT = "not published by Meta; recorded independently by several projects"


@dataclass(frozen=True)
class Weights:
    """One official checkpoint: ``name`` is what ``paddle-sam download`` takes."""

    name: str
    family: str
    model_type: str
    file: str
    url: str
    sha256: str
    checksum_from: str
    size: int | None = None
    mirrors: tuple[str, ...] = ()
    gate: str | None = None  # the page where access is asked for, for a gated file
    token_host: str | None = None  # the one host a token is sent to


def _sam2(version: str, size: str, sha256: str, checksum_from: str) -> Weights:
    prefix = "sam2.1" if version == "2.1" else "sam2"
    folder = "092824" if version == "2.1" else "072824"
    name = f"{prefix}_hiera_{size}"
    return Weights(
        name, "sam2", name, f"{name}.pt", f"{SAM2_URL}/{folder}/{name}.pt", sha256, checksum_from
    )


ONE_RECORD = "not published by Meta; one independent record"
WEIGHTS: dict[str, Weights] = {
    w.name: w
    for w in (
        Weights(
            "vit_b",
            "sam_v1",
            "vit_b",
            "sam_vit_b_01ec64.pth",
            f"{SAM_V1_URL}/sam_vit_b_01ec64.pth",
            "ec2df62732614e57411cdcf32a23ffdf28910380d03139ee0f4fcbe91eb8c912",
            INDEPENDENT,
            size=375_042_383,
        ),
        Weights(
            "vit_l",
            "sam_v1",
            "vit_l",
            "sam_vit_l_0b3195.pth",
            f"{SAM_V1_URL}/sam_vit_l_0b3195.pth",
            "3adcc4315b642a4d2101128f611684e8734c41232a17c648ed1693702a49a622",
            INDEPENDENT,
        ),
        Weights(
            "vit_h",
            "sam_v1",
            "vit_h",
            "sam_vit_h_4b8939.pth",
            f"{SAM_V1_URL}/sam_vit_h_4b8939.pth",
            "a7bf3b02f3ebf1267aba913ff637d9a2d5c33d3173bb679e46d9f338c26f262e",
            INDEPENDENT,
            size=2_564_550_879,
        ),
        Weights(
            "sam3",
            "sam3",
            "sam3",
            "sam3.pt",
            f"{HF}/facebook/sam3/resolve/3c879f39826c281e95690f02c7821c4de09afae7/sam3.pt",
            "9999e2341ceef5e136daa386eecb55cb414446a00ac2b55eb2dfd2f7c3cf8c9e",
            "the Hugging Face LFS record of facebook/sam3 (revision 3c879f3), "
            "also recorded independently",
            mirrors=(f"{HF}/1038lab/sam3/resolve/main/sam3.pt",),
            gate=f"{HF}/facebook/sam3",
            token_host="huggingface.co",
        ),
        _sam2(
            "2.1",
            "tiny",
            "7402e0d864fa82708a20fbd15bc84245c2f26dff0eb43a4b5b93452deb34be69",
            INDEPENDENT,
        ),
        _sam2(
            "2.1",
            "small",
            "6d1aa6f30de5c92224f8172114de081d104bbd23dd9dc5c58996f0cad5dc4d38",
            ONE_RECORD,
        ),
        _sam2(
            "2.1",
            "base_plus",
            "a2345aede8715ab1d5d31b4a509fb160c5a4af1970f199d9054ccfb746c004c5",
            ONE_RECORD,
        ),
        _sam2(
            "2.1",
            "large",
            "2647878d5dfa5098f2f8649825738a9345572bae2d4350a2468587ece47dd318",
            ONE_RECORD,
        ),
        _sam2(
            "2.0",
            "tiny",
            "65b50056e05bcb13694174f51bb6da89c894b57b75ccdf0ba6352c597c5d1125",
            ONE_RECORD,
        ),
        _sam2(
            "2.0",
            "small",
            "95949964d4e548409021d47b22712d5f1abf2564cc0c3c765ba599a24ac7dce3",
            ONE_RECORD,
        ),
        _sam2(
            "2.0",
            "base_plus",
            "d0bb7f236400a49669ffdd1be617959a8b1d1065081789d7bbff88eded3a8071",
            ONE_RECORD,
        ),
        _sam2(
            "2.0",
            "large",
            "7442e4e9b732a508f80e141e7c2913437a3610ee0c77381a66658c3a445df87b",
            ONE_RECORD,
        ),
    )
}


def find(name: str) -> Weights:
    """The entry called ``name`` (or whose file is ``name``); ValueError listing the names."""
    for w in WEIGHTS.values():
        if name in (w.name, w.file):
            return w
    raise ValueError(f"unknown checkpoint {name!r}; choose from {', '.join(WEIGHTS)}")


class DownloadError(ValueError):
    """A download that could not be completed or verified; the message says what to do."""


class Interrupted(DownloadError):
    """The connection ended before the whole file came; ``FILE.part`` is kept to resume."""


CHUNK = 1 << 20
MAX_REDIRECTS = 5
LOOPBACK = ("localhost", "127.0.0.1", "::1")  # plain http carries a token only to these


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # redirects are followed by _open
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _open(url: str, headers: dict, token: str | None, token_host: str | None, timeout: float):
    """GET ``url`` following up to MAX_REDIRECTS redirects by hand; the token goes only to
    ``token_host``, over https unless it is this machine, never to where a redirect leads on
    another host."""
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise DownloadError(f"refusing to download from {url!r}: not http(s)")
        sent = dict(headers)
        secure = parts.scheme == "https" or parts.hostname in LOOPBACK
        if token and token_host and parts.hostname == token_host and secure:
            sent["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, headers=sent)
        try:
            return _OPENER.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code in (301, 302, 303, 307, 308) and exc.headers.get("Location"):
                url = urllib.parse.urljoin(url, exc.headers["Location"])
                exc.close()
                continue
            raise
    raise DownloadError(f"more than {MAX_REDIRECTS} redirects from {url}")


def _hash_of(path: Path) -> hashlib._Hash:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h


def sha256_of(path: str | os.PathLike) -> str:
    return _hash_of(Path(path)).hexdigest()


def fetch(
    weights: Weights,
    dest: Path,
    *,
    url: str | None = None,
    token: str | None = None,
    progress: bool = True,
    timeout: float = 60.0,
    retries: int = 3,
    on_retry: Callable[[str], None] | None = None,
) -> Path:
    """Download ``weights`` to ``dest`` (a file path) from ``url`` (default: its official URL),
    resuming ``dest.part`` if there is one, retrying an interrupted transfer ``retries`` times,
    and giving the file its name only once its sha256 matches. Returns ``dest``."""
    from tqdm import tqdm

    url = url or weights.url
    part = dest.with_name(dest.name + ".part")
    attempt = 0
    while True:
        have = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": "paddle-sam", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            response = _open(url, headers, token, weights.token_host, timeout)
        except urllib.error.HTTPError as exc:
            raise _http_error(weights, url, exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DownloadError(f"cannot reach {_host(url)}: {reason}") from None
        with response:
            if have and response.status == 200:  # the server ignored the range: start again
                have = 0
            elif have and response.status != 206:
                raise DownloadError(f"{_host(url)} answered {response.status} to a resume")
            length = response.headers.get("Content-Length")
            total = have + int(length) if length and length.isdigit() else weights.size
            h = _hash_of(part) if have else hashlib.sha256()
            try:
                with (
                    open(part, "ab" if have else "wb") as f,
                    tqdm(
                        total=total,
                        initial=have,
                        unit="B",
                        unit_scale=True,
                        desc=dest.name,
                        disable=not progress,
                    ) as bar,
                ):
                    got = have
                    while chunk := response.read(CHUNK):
                        f.write(chunk)
                        h.update(chunk)
                        got += len(chunk)
                        bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as exc:  # reset, timeout, cut short
                got = part.stat().st_size
                why = f"{type(exc).__name__}: {exc}"
            else:
                why = None
                if total is not None and got < total:
                    why = f"the connection ended at {got} of {total} bytes"
        if why is None:
            break
        attempt += 1
        if attempt > retries:
            raise Interrupted(
                f"download of {weights.file} interrupted ({why}); {part} keeps the "
                f"{_mb(part.stat().st_size)} received: run the same command again to resume"
            )
        if on_retry:
            on_retry(f"{why}; resuming from {_mb(part.stat().st_size)}")
        time.sleep(min(2.0**attempt, 10.0) * 0.1)
    digest = h.hexdigest()
    if digest != weights.sha256:
        part.unlink()
        raise DownloadError(
            f"{weights.file} from {_host(url)} has sha256 {digest}, not the official "
            f"{weights.sha256} ({weights.checksum_from}); the file was deleted"
        )
    os.replace(part, dest)
    return dest


def _http_error(weights: Weights, url: str, exc: urllib.error.HTTPError) -> DownloadError:
    exc.close()
    if exc.code in (401, 403) and weights.gate:
        return DownloadError(
            f"{_host(url)} refused {weights.file} ({exc.code}): {weights.gate} is gated. Ask "
            f"for access there (Meta's licence), then pass --token (or set HF_TOKEN) with a "
            f"token of that account; or download the mirror's copy, verified against the same "
            f"sha256: paddle-sam download {weights.name} --mirror"
        )
    if exc.code == 416:
        return DownloadError(
            f"{_host(url)} refused to resume {weights.file} (416): delete "
            f"{weights.file}.part and run the command again"
        )
    return DownloadError(f"{_host(url)} answered {exc.code} {exc.reason} for {url}")


def _host(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc or url


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def hub_token() -> str | None:
    """A Hugging Face token from the environment or the hub's login file, if there is one."""
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(key):
            return os.environ[key].strip()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    path = Path(home) / "token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
