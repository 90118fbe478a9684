"""Video frames for SAM 3's video tracker: decoded on demand, memory bounded for long videos.

A video is a video file (read with OpenCV), a folder of frame images or a list of frames
already in memory. :func:`open_video` returns a :class:`VideoFrames` sequence whose items are
the frames preprocessed as the official SAM 3 tracker's frame loader does: PIL's default
(bicubic) resize of the RGB frame to a square, ``/ 255`` in float64, float32, then ImageNet
normalisation with float32 mean and std. Only a few decoded frames are held at a time (an LRU
cache of ``cache_frames`` RGB frames), whatever the length of the video.
"""

from __future__ import annotations

import copy
import io
import operator
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from . import io as _image_io

#: the pixel limit handed to predict.io's decoder, whose own default must not apply: a video's
#: frames are checked against the video's limit (:func:`_check_pixels`) on the size it returns
_HEADER_ONLY = 2**62

#: video containers read with OpenCV (case-insensitive)
VIDEO_EXTENSIONS = (".mp4", ".mov", ".avi", ".mkv", ".webm")

#: frame image files read in a folder (case-insensitive); the content must be one of
#: :data:`paddle_sam.predict.io.IMAGE_FORMATS`, whatever the extension says
FRAME_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: SAM 3's detector and dense video model normalise with 0.5 / 0.5
SAM3_MEAN = (0.5, 0.5, 0.5)
SAM3_STD = (0.5, 0.5, 0.5)

# on a cache miss ahead of the capture's position by at most this many frames, decode forward
# (frames before the kept chunk are only grabbed, not converted) rather than seek
_FORWARD_GAP = 64


class VideoError(ValueError):
    """A video, frame folder or frame list that cannot be read (one-line message naming it)."""


class FrameIndexError(VideoError, IndexError):
    """A frame index outside ``0 .. len - 1`` (negative indices included)."""


class VideoTooLarge(VideoError):
    """A video over one of :func:`open_video`'s limits. ``what``: ``"pixels"`` (frame
    ``frame`` is ``size`` = ``(width, height)`` pixels, or more than ``limit`` pixels when its
    size is unknown) or ``"frames"`` (more than ``limit`` frames)."""

    def __init__(
        self,
        message: str,
        what: str,
        limit: int,
        frame: int | None = None,
        size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.what, self.limit, self.frame, self.size = what, limit, frame, size


Store = Callable[[int, np.ndarray], None]


def _check_size(value: Any, name: str) -> int:
    if isinstance(value, bool | np.bool_):
        raise VideoError(f"{name} must be a positive integer, got {value!r}")
    try:
        size = operator.index(value)
    except TypeError:
        raise VideoError(f"{name} must be a positive integer, got {value!r}") from None
    if size < 1:
        raise VideoError(f"{name} must be a positive integer, got {size}")
    return size


def _check_pixels(
    name: str, width: int, height: int, limit: int | None = None, frame: int | None = None
) -> None:
    if limit is None:
        limit = _image_io.MAX_IMAGE_PIXELS  # read at call time, as predict.io does
    if width * height > limit:
        where = name if frame is None else f"{name}: frame {frame}"
        raise VideoTooLarge(
            f"{where}: {width}x{height} pixels is above the limit of {limit} pixels per frame",
            "pixels",
            limit,
            frame,
            (width, height),
        )


def _too_many(name: str, limit: int) -> VideoTooLarge:
    return VideoTooLarge(
        f"{name}: more than {limit} frames, above the limit of {limit} frames per video",
        "frames",
        limit,
    )


def _packet_image_size(packet: np.ndarray) -> tuple[int, int] | None:
    """``(width, height)`` from the header of an encoded frame that is an image file (JPEG,
    PNG, ...: :data:`IMAGE_FORMATS`), read without decoding its pixels; None for any other
    codec's packet. Too large a frame is :class:`~paddle_sam.predict.io.ImageTooLargeError`
    (PIL's own bomb limit; the caller checks its own limit on the size returned)."""
    try:
        return _image_io.image_size(io.BytesIO(packet.tobytes()), "frame", _HEADER_ONLY)
    except _image_io.ImageTooLargeError:
        raise
    except ValueError:
        return None


def _check_rgb(frame: Any, name: str) -> np.ndarray:
    if not isinstance(frame, np.ndarray):
        raise VideoError(
            f"{name}: expected an H x W x 3 uint8 RGB array or a PIL image, "
            f"got {type(frame).__name__}"
        )
    if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
        raise VideoError(
            f"{name}: expected an H x W x 3 uint8 RGB array, got shape {tuple(frame.shape)} "
            f"dtype {frame.dtype}"
        )
    if frame.shape[0] < 1 or frame.shape[1] < 1:
        raise VideoError(f"{name}: empty frame of shape {tuple(frame.shape)}")
    return frame


def preprocess_frame(
    rgb: np.ndarray,
    image_size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> np.ndarray:
    """``H x W x 3`` uint8 RGB -> ``3 x image_size x image_size`` float32, the official recipe.

    PIL's default resize (bicubic) to ``image_size x image_size``, ``/ 255.0`` in float64,
    cast to float32, then ``(x - mean) / std`` with float32 mean and std: bitwise the values of
    the official tracker's frame loader for the same RGB frame.
    """
    size = _check_size(image_size, "image_size")
    rgb = _check_rgb(rgb, "frame")
    resized = np.asarray(
        Image.fromarray(np.ascontiguousarray(rgb)).resize((size, size), Image.Resampling.BICUBIC)
    )
    x = (resized / 255.0).transpose(2, 0, 1).astype(np.float32, order="C")
    x -= np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    x /= np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    return x


def preprocess_sam3_frame(
    rgb: np.ndarray,
    image_size: int,
    mean: Sequence[float] = SAM3_MEAN,
    std: Sequence[float] = SAM3_STD,
) -> np.ndarray:
    """``H x W x 3`` uint8 RGB -> ``3 x image_size x image_size`` float16, the official dense
    video model's frame loader (its frame-folder and image path).

    PIL bilinear resize to ``image_size x image_size``, ``/ 255`` in float32, stored as
    float16, then ``(x - mean) / std`` in float16 (each step rounded as torch rounds it on the
    CPU). Upstream reads video files through OpenCV without the ``/ 255`` (frames in
    [-1, 509]; facebookresearch/sam3 issue 493) and resizes lists of PIL images bicubic; here
    every source goes through this one recipe.
    """
    size = _check_size(image_size, "image_size")
    rgb = _check_rgb(rgb, "frame")
    resized = np.asarray(
        Image.fromarray(np.ascontiguousarray(rgb)).resize((size, size), Image.Resampling.BILINEAR)
    )
    x = (resized.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)).astype(np.float16)
    x -= np.asarray(mean, dtype=np.float16).reshape(3, 1, 1)
    x /= np.asarray(std, dtype=np.float16).reshape(3, 1, 1)
    return np.ascontiguousarray(x)


#: how a decoded RGB frame becomes the model's input: ``(rgb, image_size) -> 3 x S x S``
Preprocess = Callable[[np.ndarray, int], np.ndarray]


class _Reader:
    """One kind of source: its size and a way to decode frame ``index``."""

    name: str
    length: int
    height: int
    width: int
    fps: float | None = None

    def read(self, index: int, keep_from: int, store: Store) -> np.ndarray:
        """Decode frame ``index`` (RGB) and pass what is worth caching to ``store``; frames
        ``keep_from .. index`` decoded on the way are passed to it as well."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the reader holds open (nothing by default)."""

    def copy(self) -> _Reader:
        """A reader of the same frames with nothing open, its size and length as checked
        (stateless readers are their own copy)."""
        return self


class _VideoFile(_Reader):
    """A video file through ``cv2.VideoCapture``: one capture kept open between reads.

    Opening checks the frames as they are, not as the container says: when the stream's
    frames are images (MJPEG, PNG, ... in an AVI or MKV), every frame's size is read from its
    own header before anything is decoded; then the video is decoded once to count its
    frames, frame 0's decoded size checked. Either pass stops at the first frame over a
    limit (``max_pixels`` per frame, ``max_frames``). OpenCV scales a frame whose decoded
    size differs from the stream's to the stream's size without a word: the header pass is
    what sees such frames.
    """

    def __init__(self, path: Path, max_pixels: int | None, max_frames: int | None) -> None:
        self.path = path
        self.name = str(path)
        self._cap: cv2.VideoCapture | None = None
        self._next = 0  # index of the frame the open capture returns next
        self._seek_ok = True
        self._check_frame_headers(max_pixels, max_frames)
        # CAP_PROP_FRAME_COUNT comes from the container and is often wrong: decode it all once
        cap = self._open()
        try:
            # the container's claimed size, before any decoding
            _check_pixels(
                self.name,
                int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
                int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                max_pixels,
            )
            ok, first = cap.read()
            if not ok or first is None:
                raise VideoError(f"{self.name}: the video has no frames (none could be decoded)")
            self.height, self.width = first.shape[:2]
            _check_pixels(self.name, self.width, self.height, max_pixels, 0)
            if first.ndim != 3 or first.shape[2] != 3:
                raise VideoError(
                    f"{self.name}: frame 0 decodes to shape {first.shape}, not H x W x 3"
                )
            del first
            count = 1
            while cap.grab():
                count += 1
                if max_frames is not None and count > max_frames:
                    raise _too_many(self.name, max_frames)
            fps = float(cap.get(cv2.CAP_PROP_FPS))
        finally:
            cap.release()
        self.length = count
        self.fps = fps if np.isfinite(fps) and fps > 0 else None

    def _check_frame_headers(self, max_pixels: int | None, max_frames: int | None) -> None:
        """When the stream's packets are image files, each one's size from its header (the
        packets only demuxed, nothing decoded): over ``max_pixels``, of another size than
        frame 0, or past ``max_frames`` packets, refused at the first. Other codecs: nothing
        read past the first packet."""
        cap = self._open()
        try:
            if not cap.set(cv2.CAP_PROP_FORMAT, -1):  # raw packets; a backend without: skip
                return
            first: tuple[int, int] | None = None
            index = 0
            while cap.grab():
                ok, packet = cap.retrieve()
                if not ok or packet is None:
                    return
                if packet.size == 0:  # an empty chunk (a dropped frame): nothing decoded
                    continue
                try:
                    size = _packet_image_size(packet)
                except _image_io.ImageTooLargeError as exc:
                    raise VideoTooLarge(
                        f"{self.name}: frame {index} is too large ({exc})",
                        "pixels",
                        max_pixels or _image_io.MAX_IMAGE_PIXELS,
                        index,
                    ) from None
                if size is None:
                    if first is None:
                        return  # not an image codec: the decoding pass checks what it can
                    raise VideoError(
                        f"{self.name}: frame {index} is not a readable image, but frame 0 is "
                        "one: a damaged or crafted file"
                    )
                _check_pixels(self.name, *size, max_pixels, index)
                if first is None:
                    first = size
                elif size != first:
                    raise VideoError(
                        f"{self.name}: frame {index} is {size[0]}x{size[1]}, but frame 0 is "
                        f"{first[0]}x{first[1]}; all frames of a video must have one size"
                    )
                index += 1
                if max_frames is not None and index > max_frames:
                    raise _too_many(self.name, max_frames)
        finally:
            cap.release()

    def _open(self) -> cv2.VideoCapture:
        # FFmpeg by name: never the image-sequence backend, which reads "%d" in a path as a
        # pattern
        api = cv2.CAP_FFMPEG if cv2.videoio_registry.hasBackend(cv2.CAP_FFMPEG) else cv2.CAP_ANY
        cap = cv2.VideoCapture(str(self.path), api)
        if not cap.isOpened():
            cap.release()
            raise VideoError(f"{self.name}: corrupt or unreadable video (OpenCV cannot open it)")
        return cap

    def _reopen(self) -> cv2.VideoCapture:
        self.close()
        self._cap = self._open()
        self._next = 0
        return self._cap

    def _start_at(self, start: int) -> cv2.VideoCapture:
        """The open capture moved so that its next frame is at most ``start``: ``start`` itself
        after an exact seek, else frame 0 of a reopened capture (when the position after a seek
        is not the one asked for; seeking is then never tried again in this file)."""
        cap = self._cap
        if self._next == start:
            return cap
        if self._seek_ok:
            if cap.set(cv2.CAP_PROP_POS_FRAMES, start) and (
                int(cap.get(cv2.CAP_PROP_POS_FRAMES)) == start
            ):
                self._next = start
                return cap
            self._seek_ok = False
        return self._reopen()

    def read(self, index: int, keep_from: int, store: Store) -> np.ndarray:
        cap = self._cap if self._cap is not None else self._reopen()
        if not 0 <= index - self._next <= _FORWARD_GAP:
            cap = self._start_at(keep_from)
        try:
            while self._next < keep_from:  # only grabbed: nothing kept, no colour conversion
                if not cap.grab():
                    raise self._lost(self._next)
                self._next += 1
            frame = None
            while self._next <= index:
                ok, bgr = cap.read()
                if not ok or bgr is None:
                    raise self._lost(self._next)
                if bgr.shape != (self.height, self.width, 3):
                    raise VideoError(
                        f"{self.name}: frame {self._next} decodes to shape {bgr.shape}, but "
                        f"the video is {self.width}x{self.height}"
                    )
                frame = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
                store(self._next, frame)
                self._next += 1
        except BaseException:
            self.close()  # the position is unknown now: start afresh next time
            raise
        assert frame is not None
        return frame

    def _lost(self, index: int) -> VideoError:
        return VideoError(
            f"{self.name}: frame {index} cannot be decoded (the video had {self.length} frames "
            "when opened)"
        )

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None
        self._next = 0

    def copy(self) -> _VideoFile:
        twin = copy.copy(self)
        twin._cap, twin._next, twin._seek_ok = None, 0, True
        return twin


def _sorted_frame_names(names: list[str]) -> list[str]:
    """Sorted by the integer value of the name's stem as upstream does (``0.jpg``, ``2.jpg``,
    ``10.jpg``); by name when some stem is not an integer."""
    try:
        keyed = [(int(os.path.splitext(name)[0]), name) for name in names]
    except ValueError:
        return sorted(names)
    return [name for _, name in sorted(keyed)]


class _FrameFolder(_Reader):
    """A folder of frame images, sorted as upstream sorts them; only headers read at open."""

    def __init__(self, folder: Path, max_pixels: int | None, max_frames: int | None) -> None:
        self.name = str(folder)
        self.max_pixels = max_pixels
        try:
            names = [
                entry.name
                for entry in os.scandir(folder)
                if entry.is_file() and os.path.splitext(entry.name)[1].lower() in FRAME_EXTENSIONS
            ]
        except OSError as exc:
            raise VideoError(f"{self.name}: cannot list the folder ({exc})") from exc
        if not names:
            raise VideoError(
                f"{self.name}: no frames in the folder (extensions read: "
                f"{', '.join(FRAME_EXTENSIONS)})"
            )
        if max_frames is not None and len(names) > max_frames:
            raise _too_many(self.name, max_frames)
        self.paths = [folder / name for name in _sorted_frame_names(names)]
        self.length = len(self.paths)
        first = self.paths[0]
        self.width, self.height = self._header(first)
        for path in self.paths[1:]:
            size = self._header(path)
            if size != (self.width, self.height):
                raise VideoError(
                    f"{path}: frame is {size[0]}x{size[1]}, but the first frame ({first.name}) "
                    f"is {self.width}x{self.height}; all frames of a video must have one size"
                )

    def _header(self, path: Path) -> tuple[int, int]:
        """The frame's size from its header (no pixel decoded), checked against the limit."""
        try:
            width, height = _image_io.image_size(path, str(path), _HEADER_ONLY)
        except ValueError as exc:  # the allow-list, damaged files, PIL's bomb limit
            raise VideoError(str(exc)) from None
        _check_pixels(str(path), width, height, self.max_pixels)
        return width, height

    def read(self, index: int, keep_from: int, store: Store) -> np.ndarray:
        path = self.paths[index]
        self._header(path)
        try:
            # upstream's conversion; like upstream, EXIF orientation is not applied (frames
            # keep the size their headers give)
            with _image_io.open_image(
                path, f"{path}: frame {index}", _HEADER_ONLY, orient=False
            ) as im:
                frame = np.asarray(im.convert("RGB"))
        except ValueError as exc:  # truncated or damaged files
            raise VideoError(str(exc)) from None
        if frame.shape != (self.height, self.width, 3):
            raise VideoError(
                f"{path}: frame {index} is {frame.shape[1]}x{frame.shape[0]}, but the video is "
                f"{self.width}x{self.height}"
            )
        store(index, frame)
        return frame


class _FrameList(_Reader):
    """Frames the caller holds (arrays or PIL images), kept as given."""

    def __init__(
        self, frames: list | tuple, max_pixels: int | None, max_frames: int | None
    ) -> None:
        self.name = f"a list of {len(frames)} frames"
        if not frames:
            raise VideoError("the list of frames is empty")
        if max_frames is not None and len(frames) > max_frames:
            raise _too_many(self.name, max_frames)
        self.frames = frames
        self.length = len(frames)
        size = None
        for k, frame in enumerate(frames):
            if isinstance(frame, Image.Image):
                width, height = frame.size
            else:
                height, width = _check_rgb(frame, f"{self.name}: frame {k}").shape[:2]
            _check_pixels(self.name, width, height, max_pixels, k)
            if size is None:
                size = (width, height)
            elif (width, height) != size:
                raise VideoError(
                    f"{self.name}: frame {k} is {width}x{height}, but frame 0 is "
                    f"{size[0]}x{size[1]}; all frames of a video must have one size"
                )
        self.width, self.height = size

    def read(self, index: int, keep_from: int, store: Store) -> np.ndarray:
        frame = self.frames[index]
        if isinstance(frame, Image.Image):
            rgb = np.asarray(frame.convert("RGB"))
            store(index, rgb)  # converted: worth keeping
            return rgb
        view = frame.view()
        view.flags.writeable = False
        return view


class VideoFrames(Sequence):
    """Frames of one video, decoded on demand.

    ``frames[i]`` is frame ``i`` preprocessed for the tracker (``3 x S x S`` float32 numpy,
    :func:`preprocess_frame`; the caller converts it to a paddle tensor); :meth:`rgb` the
    original ``H x W x 3`` uint8 RGB frame (read-only). Attributes: ``height``, ``width`` (the
    original frames'), ``fps`` (None when unknown: folders and lists), ``source`` (a
    description: the path, or "a list of N frames"), ``image_size`` (S) and ``cache_frames``.

    At most ``cache_frames`` decoded RGB frames are kept (least recently used dropped first;
    :meth:`cached_count` says how many are held); nothing else holds frames, so memory is
    bounded whatever the length of the video. Frames of a list are the caller's and are not
    copied. For a video file one ``cv2.VideoCapture`` stays open between reads: sequential
    forward reads never seek; a miss elsewhere seeks a little before the frame and decodes
    forward, keeping that chunk, so reverse sequential reads decode each frame about once too.
    Release the capture with :meth:`close` or a ``with`` block (a later read reopens it).
    Not thread-safe: one reader at a time.
    """

    def __init__(
        self,
        source: str | os.PathLike | list | tuple,
        image_size: int = 1008,
        cache_frames: int = 16,
        preprocess: Preprocess = preprocess_frame,
        max_pixels: int | None = None,
        max_frames: int | None = None,
    ) -> None:
        if max_pixels is not None:
            max_pixels = _check_size(max_pixels, "max_pixels")
        if max_frames is not None:
            max_frames = _check_size(max_frames, "max_frames")
        self._setup(
            _make_reader(source, max_pixels, max_frames), image_size, cache_frames, preprocess
        )

    def _setup(
        self, reader: _Reader, image_size: int, cache_frames: int, preprocess: Preprocess
    ) -> None:
        self.image_size = _check_size(image_size, "image_size")
        self.cache_frames = _check_size(cache_frames, "cache_frames")
        self.preprocess = preprocess
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._reader = reader
        self.source = reader.name
        self.height = reader.height
        self.width = reader.width
        self.fps = reader.fps

    def reopen(
        self,
        image_size: int | None = None,
        cache_frames: int | None = None,
        preprocess: Preprocess | None = None,
    ) -> VideoFrames:
        """Other frames of the same video (a reader of their own: a capture, a cache), with
        its length and size as checked when this one opened: nothing is decoded again.
        Unset arguments are this one's."""
        twin = VideoFrames.__new__(VideoFrames)
        twin._setup(
            self._reader.copy(),
            self.image_size if image_size is None else image_size,
            self.cache_frames if cache_frames is None else cache_frames,
            self.preprocess if preprocess is None else preprocess,
        )
        twin.source = self.source
        return twin

    def __len__(self) -> int:
        return self._reader.length

    def _index(self, index: Any) -> int:
        if isinstance(index, bool | np.bool_):
            raise VideoError(f"{self.source}: frame indices are integers, got {index!r}")
        try:
            i = operator.index(index)
        except TypeError:
            raise VideoError(
                f"{self.source}: frame indices are integers, got {type(index).__name__}"
            ) from None
        n = len(self)
        if not 0 <= i < n:
            raise FrameIndexError(
                f"{self.source}: frame index {i} out of range: the video has {n} frames (0-{n - 1})"
            )
        return i

    def _store(self, index: int, frame: np.ndarray) -> None:
        frame.flags.writeable = False
        self._cache[index] = frame
        self._cache.move_to_end(index)
        while len(self._cache) > self.cache_frames:
            self._cache.popitem(last=False)

    def rgb(self, index: int) -> np.ndarray:
        """Frame ``index`` as decoded: ``height x width x 3`` uint8 RGB, read-only."""
        i = self._index(index)
        frame = self._cache.get(i)
        if frame is not None:
            self._cache.move_to_end(i)
            return frame
        return self._reader.read(i, max(0, i - self.cache_frames // 2), self._store)

    def __getitem__(self, index: int) -> np.ndarray:
        """Frame ``index`` preprocessed: ``3 x image_size x image_size`` (float32 with the
        default :func:`preprocess_frame`)."""
        return self.preprocess(self.rgb(index), self.image_size)

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]

    def cached_count(self) -> int:
        """How many decoded RGB frames the cache holds now (at most ``cache_frames``)."""
        return len(self._cache)

    def close(self) -> None:
        """Release the open video capture, if any, and empty the cache."""
        self._reader.close()
        self._cache.clear()

    def __enter__(self) -> VideoFrames:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            try:
                reader.close()
            except Exception:  # interpreter shutdown: nothing left to release
                pass

    def __repr__(self) -> str:
        return (
            f"VideoFrames({self.source!r}, {len(self)} frames, {self.width}x{self.height}, "
            f"fps={self.fps}, image_size={self.image_size})"
        )


def _make_reader(source: Any, max_pixels: int | None, max_frames: int | None) -> _Reader:
    if isinstance(source, list | tuple):
        return _FrameList(source, max_pixels, max_frames)
    if not isinstance(source, str | os.PathLike):
        raise VideoError(
            "a video is a path to a video file or a folder of frames, or a list of frames; "
            f"got {type(source).__name__}"
        )
    path = Path(source)
    if path.is_dir():
        return _FrameFolder(path, max_pixels, max_frames)
    if not path.exists():
        raise VideoError(f"{path}: no such video file or folder")
    if not path.is_file() or path.suffix.lower() not in VIDEO_EXTENSIONS:
        raise VideoError(
            f"{path}: neither a folder of frames nor a video file (video extensions read: "
            f"{', '.join(VIDEO_EXTENSIONS)})"
        )
    return _VideoFile(path, max_pixels, max_frames)


def open_video(
    source: str | os.PathLike | list | tuple,
    image_size: int = 1008,
    cache_frames: int = 16,
    preprocess: Preprocess = preprocess_frame,
    max_pixels: int | None = None,
    max_frames: int | None = None,
) -> VideoFrames:
    """Open a video for the tracker: frames decoded on demand (:class:`VideoFrames`).

    ``source``: a path to a video file (:data:`VIDEO_EXTENSIONS`, any case) or to a folder of
    frame images (:data:`FRAME_EXTENSIONS`, sorted by the integer value of their names, else
    by name), or a list / tuple of frames (``H x W x 3`` uint8 RGB arrays or PIL images,
    converted to RGB). All frames must have one size. A video file is decoded once here to
    count its frames exactly; a folder's images only have their headers read. ``image_size``:
    the side of the square preprocessed frames; ``preprocess``: the tracker's recipe
    (:func:`preprocess_frame`) or the dense video model's (:func:`preprocess_sam3_frame`).

    Limits, each checked on the frames themselves (a container's header can say anything)
    and stopping at the first frame past it: ``max_pixels`` per frame (default
    :data:`paddle_sam.predict.io.MAX_IMAGE_PIXELS`), ``max_frames`` (default: none). A video
    file whose frames are images (MJPEG, PNG, ... in an AVI or MKV) has every frame's header
    read before anything is decoded; frames of different sizes are refused (OpenCV would
    scale them to the first one's size silently).
    Raises :class:`VideoTooLarge` past a limit and :class:`VideoError` for anything
    unreadable, with a one-line message naming it.
    """
    return VideoFrames(
        source,
        image_size=image_size,
        cache_frames=cache_frames,
        preprocess=preprocess,
        max_pixels=max_pixels,
        max_frames=max_frames,
    )
