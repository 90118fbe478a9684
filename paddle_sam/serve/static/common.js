// paddle-sam web pages (images: app.js, video: video.js): what both need. The token,
// the API with it, the status line and progress bar, COCO RLE decoding.
// Plain browser JavaScript, no build step and no network beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);

// -- the server's token --
// `paddle-sam serve --token T` prints this page's address ending in /#token=T. The
// fragment never reaches the server or its logs; the page keeps the token in sessionStorage
// (this tab only), takes it out of the address bar, and sends it with every request.

const TOKEN_KEY = "paddle-sam-token";

function readToken() {
  const m = /(?:^#|&)token=([^&]*)/.exec(window.location.hash);
  if (m) {
    const token = decodeURIComponent(m[1]);
    try {
      sessionStorage.setItem(TOKEN_KEY, token);
    } catch (_) {
      // storage disabled: the token lives as long as the page
    }
    history.replaceState(null, "", window.location.pathname + window.location.search);
    return token;
  }
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch (_) {
    return "";
  }
}

let TOKEN = readToken();

function authHeaders(headers = {}) {
  return TOKEN ? { ...headers, Authorization: `Bearer ${TOKEN}` } : headers;
}

function api(url, options = {}) {
  return fetch(url, { ...options, headers: authHeaders(options.headers || {}) });
}

const NEEDS_TOKEN = "This server needs its token: open the address it printed (ending in " +
  "#token=…).";

// -- status and progress --

function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

function setProgress(value) {
  const bar = $("progress");
  if (value === null) {
    bar.hidden = true;
    return;
  }
  bar.hidden = false;
  if (value === undefined) bar.removeAttribute("value");
  else bar.value = value;
}

async function apiError(response) {
  if (response.status === 401) return NEEDS_TOKEN;
  try {
    const body = await response.json();
    return body.detail || body.error || response.statusText;
  } catch (_) {
    return `${response.status} ${response.statusText}`;
  }
}

// -- masks --

function decodeCocoRle(rle) {
  // COCO compressed RLE: column-major run lengths, LEB128-like 6-bit chars (pycocotools)
  const s = rle.counts;
  const counts = [];
  let p = 0;
  while (p < s.length) {
    let x = 0;
    let k = 0;
    let more = 1;
    while (more) {
      const c = s.charCodeAt(p) - 48;
      x |= (c & 0x1f) << (5 * k);
      more = c & 0x20;
      p++;
      k++;
      if (!more && c & 0x10) x |= -1 << (5 * k);
    }
    if (counts.length > 2) x += counts[counts.length - 2];
    counts.push(x);
  }
  return counts;
}

// -- pointer on a canvas --
// A press that moves less than DRAG_PIXELS (screen pixels) is a click, else a drag. While the
// left button drags, onDrag(box); when a press ends, onRelease({ start, button, drag, box }).
// Coordinates are those of toCoords(event) (the image's or the video's pixels); boxes are
// [x0, y0, x1, y1].

const DRAG_PIXELS = 5;

function boxBetween(a, b) {
  return [Math.min(a.x, b.x), Math.min(a.y, b.y), Math.max(a.x, b.x), Math.max(a.y, b.y)];
}

function bindPointer(canvas, { active, toCoords, onDrag, onRelease }) {
  let press = null;
  canvas.addEventListener("contextmenu", (e) => e.preventDefault());
  canvas.addEventListener("mousedown", (e) => {
    if (!active()) return;
    press = { sx: e.clientX, sy: e.clientY, start: toCoords(e), button: e.button, drag: false };
  });
  window.addEventListener("mousemove", (e) => {
    if (!press) return;
    if (Math.hypot(e.clientX - press.sx, e.clientY - press.sy) > DRAG_PIXELS) press.drag = true;
    if (press.drag && press.button === 0) onDrag(boxBetween(press.start, toCoords(e)));
  });
  window.addEventListener("mouseup", (e) => {
    if (!press) return;
    const { start, button, drag } = press;
    press = null;
    onRelease({ start, button, drag, box: boxBetween(start, toCoords(e)) });
  });
}
