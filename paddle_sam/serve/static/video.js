// paddle-sam video page: open a short video, type a concept (SAM 3) or click objects or draw
// their boxes on any frame, propagate (with progress, cancellable), scrub through the frames
// with the overlay, correct with clicks and propagate again, download the results JSON and
// the overlay MP4.
// Plain browser JavaScript, no build step and no network beyond this server; common.js
// (loaded first) has the token, the API helpers, the status line and the RLE decoder.
"use strict";

const video = {
  health: null,
  session: null,       // GET /videos/{id}: session_id, width, height, num_frames, fps, ...
  frame: 0,            // the frame shown
  selected: null,      // the object the next click refines; null: a new object
  points: new Map(),   // "obj:frame" -> [{x, y, label}]: an object's clicks on a frame
  boxes: new Map(),    // "obj:frame" -> [x0, y0, x1, y1]: an object's box on a frame (SAM 2)
  text: "",
  busy: false,         // a request that changes the session is running
  job: null,           // the propagation in progress
  shown: 0,            // counter of frame requests: only the latest one is drawn
  frames: new Map(),   // a few decoded frames (index -> ImageBitmap), least recent first
};

const OVERLAY_ALPHA = 150;
const FRAMES_KEPT = 24;

// -- colours: the overlay MP4's (paddle_sam.predict.track_outputs.obj_color) --

function hsvToRgb(h, s, v) {
  // Python's colorsys.hsv_to_rgb
  const i = Math.floor(h * 6.0);
  const f = h * 6.0 - i;
  const p = v * (1.0 - s);
  const q = v * (1.0 - s * f);
  const t = v * (1.0 - s * (1.0 - f));
  switch (i % 6) {
    case 0: return [v, t, p];
    case 1: return [q, v, p];
    case 2: return [p, v, t];
    case 3: return [p, q, v];
    case 4: return [t, p, v];
    default: return [v, p, q];
  }
}

function objColor(objId) {
  const hue = (0.6 + objId * 0.618033988749895) % 1.0;
  return hsvToRgb(hue, 0.85, 1.0).map((c) => Math.round(255 * c));
}

// -- model info --

function takesText() {
  // SAM 3 takes a concept (text, exemplar boxes); SAM 2 one object's clicks and box
  return !video.health || video.health.model.takes_text !== false;
}

function promptHelp() {
  return takesText()
    ? "Type a concept and Find, or click an object · right click: negative point · drag: an " +
      "example box · then Propagate, scrub with the slider or ← →"
    : "Click an object (right click: a negative point) or drag a box around it · New object " +
      "for the next one · then Propagate, scrub with the slider or ← →";
}

async function loadHealth() {
  try {
    const r = await api("/health");
    if (r.status === 401) {
      $("model-info").textContent = "token needed";
      setStatus(NEEDS_TOKEN, true);
      return;
    }
    video.health = await r.json();
    const m = video.health.model;
    $("text-form").hidden = !m.takes_text;  // SAM 2 takes clicks and boxes only
    $("text-sep").hidden = !m.takes_text;
    $("drop-hint-keys").textContent = promptHelp();
    $("model-info").textContent =
      `model ${m.type} (${m.runtime}), ${video.health.threads ?? "?"} threads`;
    const v = video.health.video;
    if (!v.available) {
      $("open-label").classList.add("disabled");
      $("file-input").disabled = true;
      setStatus(v.detail, true);
    } else if (!video.session) {
      const l = v.limits;
      const mb = Math.round(l.max_video_upload_bytes / 2 ** 20);
      setStatus(`Open a short video (button or drag and drop): at most ${l.max_video_frames} ` +
        `frames, ${l.max_video_seconds} s, ${l.max_video_pixels} pixels a frame, ${mb} MB.`);
    }
  } catch (e) {
    $("model-info").textContent = "server unreachable";
  }
}

// -- upload --

function uploadVideo(file) {
  // XMLHttpRequest rather than fetch: it reports upload progress
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    const form = new FormData();
    form.append("video", file, file.name || "video");
    xhr.open("POST", "/videos");
    if (TOKEN) xhr.setRequestHeader("Authorization", `Bearer ${TOKEN}`);
    xhr.responseType = "json";
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) {
        setStatus(`Uploading ${file.name}… ${Math.round((100 * e.loaded) / e.total)}%`);
        setProgress(e.loaded / e.total);
      }
    };
    xhr.upload.onload = () => {
      setStatus(`Checking and opening ${file.name}…`);
      setProgress(undefined);
    };
    xhr.onload = () => {
      if (xhr.status === 201) resolve(xhr.response);
      else if (xhr.status === 401) reject(new Error(NEEDS_TOKEN));
      else {
        const body = xhr.response || {};
        reject(new Error(body.detail || `upload failed (${xhr.status})`));
      }
    };
    xhr.onerror = () => reject(new Error("upload failed: server unreachable"));
    xhr.send(form);
  });
}

async function openVideo(file) {
  if (!file || !video.health || !video.health.video.available) return;
  if (video.session) {
    api(`/videos/${video.session.session_id}`, { method: "DELETE" }).catch(() => {});
  }
  video.session = null;
  video.frames.clear();
  video.points.clear();
  video.boxes.clear();
  video.selected = null;
  video.text = "";
  $("text-input").value = "";
  updateControls();
  setProgress(0);
  let info;
  try {
    info = await uploadVideo(file);
  } catch (e) {
    setProgress(null);
    setStatus(e.message, true);
    return;
  }
  setProgress(null);
  video.session = info;
  for (const id of ["image-canvas", "overlay-canvas", "prompt-canvas"]) {
    $(id).width = info.width;
    $(id).height = info.height;
  }
  $("stage").dataset.session = info.session_id;
  $("stage").hidden = false;
  fitStage();
  $("drop-hint").hidden = true;
  $("timeline").hidden = false;
  const slider = $("frame-slider");
  slider.max = String(info.num_frames - 1);
  slider.value = "0";
  const fps = info.fps ? ` at ${info.fps.toFixed(2)} fps` : "";
  const how = takesText()
    ? "Type a concept and Find, or click an object."
    : "Click an object or drag a box around it.";
  setStatus(`Ready: ${info.width}×${info.height}, ${info.num_frames} frames${fps}. ${how}`);
  await showFrame(0);
  updateObjects(info);
  updateControls();
}

// -- frames and their overlay --

function fitStage() {
  // the frame as large as the window allows, small videos scaled up too (clicks are mapped
  // through the displayed size)
  if (!video.session) return;
  const { width, height } = video.session;
  const scale = Math.min((window.innerWidth - 48) / width, (window.innerHeight * 0.7) / height);
  const c = $("image-canvas");
  c.style.width = `${Math.max(1, Math.floor(width * scale))}px`;
  c.style.height = `${Math.max(1, Math.floor(height * scale))}px`;
}

async function frameBitmap(i) {
  const sid = video.session.session_id;
  const key = `${sid}:${i}`;
  if (video.frames.has(key)) {
    const bmp = video.frames.get(key);
    video.frames.delete(key);
    video.frames.set(key, bmp);
    return bmp;
  }
  const r = await api(`/videos/${sid}/frames/${i}.jpg`);
  if (!r.ok) throw new Error(await apiError(r));
  const bmp = await createImageBitmap(await r.blob());
  video.frames.set(key, bmp);
  while (video.frames.size > FRAMES_KEPT) video.frames.delete(video.frames.keys().next().value);
  return bmp;
}

async function frameResults(i) {
  const r = await api(`/videos/${video.session.session_id}/frames/${i}`);
  if (!r.ok) throw new Error(await apiError(r));
  return r.json();
}

async function showFrame(i, results = null) {
  // the frame's image and its objects; draws only if no later frame was asked for meanwhile
  if (!video.session) return;
  const n = video.session.num_frames;
  i = Math.max(0, Math.min(n - 1, i));
  video.frame = i;
  $("frame-slider").value = String(i);
  $("frame-label").textContent = `frame ${i} / ${n - 1}`;
  const ticket = ++video.shown;
  let bmp;
  try {
    [bmp, results] = await Promise.all([frameBitmap(i), results || frameResults(i)]);
  } catch (e) {
    if (ticket === video.shown) setStatus(e.message, true);
    return;
  }
  if (ticket !== video.shown) return;
  const img = $("image-canvas");
  img.getContext("2d").drawImage(bmp, 0, 0, img.width, img.height);
  img.dataset.frame = String(i);
  drawOverlay(i, results);
  drawPrompts();
}

function drawOverlay(i, results) {
  // every object in its colour, higher ids over lower ones, as the overlay MP4 draws them
  const c = $("overlay-canvas");
  const ctx = c.getContext("2d");
  const out = ctx.createImageData(c.width, c.height);
  const objects = [...results.objects].sort((a, b) => a.obj_id - b.obj_id);
  const h = c.height;
  for (const o of objects) {
    const [r, g, b] = objColor(o.obj_id);
    const rgba = [r, g, b, OVERLAY_ALPHA];
    const counts = decodeCocoRle(o.rle);
    let idx = 0;
    counts.forEach((run, j) => {
      if (j % 2 === 1) {
        for (let t = idx; t < idx + run; t++) {
          const row = t % h;
          const col = (t - row) / h;
          out.data.set(rgba, 4 * (row * c.width + col));
        }
      }
      idx += run;
    });
  }
  ctx.putImageData(out, 0, 0);
  c.dataset.frame = String(i);
  c.dataset.objects = JSON.stringify(objects.map((o) => o.obj_id));
  c.dataset.hasResults = String(results.has_results !== false);
  c.dataset.version = String(Number(c.dataset.version || 0) + 1);
  const chips = objects.map((o) => `${o.obj_id}: ${o.score.toFixed(2)}`).join(" · ");
  $("frame-label").textContent = `frame ${i} / ${video.session.num_frames - 1}` +
    (results.has_results === false ? " (no results yet)" : chips ? ` — ${chips}` : "");
}

// -- objects --

function updateObjects(info) {
  video.session = { ...video.session, ...info };
  const box = $("objects");
  box.textContent = "";
  for (const id of info.objects) {
    const chip = document.createElement("span");
    chip.className = "object";
    chip.dataset.objId = String(id);
    chip.classList.toggle("selected", id === video.selected);
    const [r, g, b] = objColor(id);
    chip.style.borderColor = `rgb(${r}, ${g}, ${b})`;
    chip.title = "click to refine this object with the next clicks";
    chip.textContent = `object ${id}`;
    chip.onclick = () => {
      video.selected = video.selected === id ? null : id;
      updateObjects(video.session);
    };
    const x = document.createElement("span");
    x.className = "remove";
    x.textContent = "×";
    x.title = `stop tracking object ${id}`;
    x.onclick = (e) => {
      e.stopPropagation();
      removeObject(id);
    };
    chip.appendChild(x);
    box.appendChild(chip);
  }
  if (video.selected !== null && !info.objects.includes(video.selected)) video.selected = null;
  $("new-object-button").classList.toggle("chosen", video.selected === null);
}

async function refreshSession() {
  const r = await api(`/videos/${video.session.session_id}`);
  if (r.ok) updateObjects(await r.json());
  else if (r.status === 410) sessionGone();
}

function sessionGone() {
  setStatus("The server dropped this video (memory budget or idle time): open it again.", true);
  video.session = null;
  updateControls();
}

function updateControls() {
  const ready = !!video.session && !video.busy && !video.job;
  for (const id of ["find-button", "new-object-button", "propagate-button", "reset-button"]) {
    $(id).disabled = !ready;
  }
  const any = !!video.session && video.session.frames_with_results > 0 && !video.busy;
  $("json-button").disabled = !any;
  $("mp4-button").disabled = !any;
  $("cancel-button").hidden = !video.job;
  $("propagate-button").hidden = !!video.job;
}

// -- prompts --

function pointsKey(obj, frame) {
  return `${obj}:${frame}`;
}

function drawPrompts(dragBox = null) {
  const c = $("prompt-canvas");
  const ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  const r = Math.max(3, Math.round(0.01 * Math.max(c.width, c.height)));
  if (dragBox) {
    ctx.lineWidth = Math.max(2, r / 2);
    ctx.strokeStyle = "#00e676";
    ctx.strokeRect(dragBox[0], dragBox[1], dragBox[2] - dragBox[0], dragBox[3] - dragBox[1]);
  }
  const boxes = [];
  for (const [key, b] of video.boxes) {
    const [obj, frame] = key.split(":").map(Number);
    if (frame !== video.frame) continue;
    const [cr, cg, cb] = objColor(obj);
    ctx.lineWidth = Math.max(2, r / 2);
    ctx.strokeStyle = `rgb(${cr}, ${cg}, ${cb})`;
    ctx.strokeRect(b[0], b[1], b[2] - b[0], b[3] - b[1]);
    boxes.push([obj, ...b]);
  }
  // the boxes on this frame as sent, for scripts and tests: [[obj_id, x0, y0, x1, y1], ...]
  c.dataset.boxes = JSON.stringify(boxes);
  const shown = [];
  for (const [key, pts] of video.points) {
    const [obj, frame] = key.split(":").map(Number);
    if (frame !== video.frame) continue;
    for (const p of pts) {
      ctx.beginPath();
      ctx.arc(p.x, p.y, r, 0, 2 * Math.PI);
      const [cr, cg, cb] = objColor(obj);
      ctx.fillStyle = p.label === 1 ? `rgb(${cr}, ${cg}, ${cb})` : "#e53935";
      ctx.fill();
      ctx.lineWidth = Math.max(1, r / 3);
      ctx.strokeStyle = p.label === 1 ? "#fff" : "#000";
      ctx.stroke();
      shown.push([obj, p.x, p.y, p.label]);
    }
  }
  // the clicks on this frame as sent, for scripts and tests: [[obj_id, x, y, label], ...]
  c.dataset.points = JSON.stringify(shown);
}

function toVideo(e) {
  const c = $("prompt-canvas");
  const r = c.getBoundingClientRect();
  const x = ((e.clientX - r.left) / r.width) * c.width;
  const y = ((e.clientY - r.top) / r.height) * c.height;
  return { x: Math.min(Math.max(x, 0), c.width), y: Math.min(Math.max(y, 0), c.height) };
}

async function sendPrompt(body, what) {
  if (!video.session || video.busy || video.job) return null;
  video.busy = true;
  updateControls();
  const sid = video.session.session_id;
  try {
    const r = await api(`/videos/${sid}/prompt`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (r.status === 410) {
      sessionGone();
      return null;
    }
    if (!r.ok) {
      setStatus(await apiError(r), true);
      return null;
    }
    const answer = await r.json();
    await refreshSession();
    if (video.frame === answer.frame_index) {
      await showFrame(answer.frame_index, { has_results: true, objects: answer.objects });
    }
    const n = answer.objects.length;
    const model = `${answer.timings_ms.model.toFixed(0)} ms`;
    const more = video.session.num_frames > 1 ? "; Propagate to track through the video" : "";
    setStatus(`${what}: ${n} object${n === 1 ? "" : "s"} on frame ${answer.frame_index} ` +
      `(${model})${more}.`);
    return answer;
  } catch (e) {
    setStatus(`request failed: ${e.message}`, true);
    return null;
  } finally {
    video.busy = false;
    updateControls();
  }
}

async function findText(box = null) {
  const text = $("text-input").value.trim();
  if (!text && !box) return;
  const body = { frame_index: video.frame, outputs: ["rle"] };
  if (text) body.text = text;
  if (box) body.boxes = [box];
  const answer = await sendPrompt(body, text ? `"${text}"` : "example box");
  if (answer) {
    // a concept starts over: earlier clicks belong to objects that are gone
    video.text = text;
    video.points.clear();
    video.boxes.clear();
    video.selected = null;
    drawPrompts();
    updateObjects(video.session);
  }
}

async function objectPrompt({ point = null, box = null }) {
  // a click or (SAM 2) a box for the selected object, or a new one. Each request sends all
  // of the object's clicks on this frame and its box there (they replace the last ones).
  const obj = video.selected;
  const key = obj === null ? null : pointsKey(obj, video.frame);
  const earlier = key && video.points.has(key) ? video.points.get(key) : [];
  const pts = point ? [...earlier, point] : earlier;
  const objBox = box || (key && video.boxes.has(key) ? video.boxes.get(key) : null);
  const body = { frame_index: video.frame, outputs: ["rle"] };
  if (pts.length) {
    body.points = pts.map((p) => [p.x, p.y]);
    body.labels = pts.map((p) => p.label);
  }
  if (objBox) body.boxes = [objBox];
  if (obj !== null) body.obj_id = obj;
  const what = (obj === null ? "new object" : `object ${obj}`) + (box ? " (box)" : "");
  const answer = await sendPrompt(body, what);
  if (!answer) return;
  const done = pointsKey(answer.obj_id, answer.frame_index);
  if (pts.length) video.points.set(done, pts);
  if (objBox) video.boxes.set(done, objBox);
  video.selected = answer.obj_id;
  updateObjects(video.session);
  drawPrompts();
}

function click(x, y, negative) {
  return objectPrompt({ point: { x, y, label: negative ? 0 : 1 } });
}

async function removeObject(id) {
  if (!video.session || video.busy || video.job) return;
  video.busy = true;
  updateControls();
  try {
    const r = await api(`/videos/${video.session.session_id}/objects/${id}`, {
      method: "DELETE",
    });
    if (!r.ok) {
      setStatus(await apiError(r), true);
      return;
    }
    for (const map of [video.points, video.boxes]) {
      for (const key of [...map.keys()]) {
        if (key.startsWith(`${id}:`)) map.delete(key);
      }
    }
    if (video.selected === id) video.selected = null;
    await refreshSession();
    await showFrame(video.frame);
    setStatus(`Object ${id} removed from every frame.`);
  } finally {
    video.busy = false;
    updateControls();
  }
}

async function resetVideo() {
  if (!video.session || video.busy || video.job) return;
  const r = await api(`/videos/${video.session.session_id}/reset`, { method: "POST" });
  if (!r.ok) {
    setStatus(await apiError(r), true);
    return;
  }
  video.points.clear();
  video.boxes.clear();
  video.selected = null;
  video.text = "";
  $("text-input").value = "";
  updateObjects(await r.json());
  await showFrame(video.frame);
  updateControls();
  setStatus("Every prompt and object forgotten.");
}

// -- propagation --

async function propagate() {
  if (!video.session || video.busy || video.job) return;
  const sid = video.session.session_id;
  const direction = $("direction-select").value;
  let r = await api(`/videos/${sid}/propagate`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ direction }),
  });
  if (!r.ok) {
    setStatus(await apiError(r), true);
    return;
  }
  let job = await r.json();
  video.job = job;
  $("propagate-button").dataset.job = job.job_id;
  updateControls();
  setProgress(0);
  while (job.status === "queued" || job.status === "running") {
    const what = job.cancel_requested ? "Cancelling" : "Propagating";
    setStatus(`${what}… ${job.done} of ${job.total} frames` +
      (job.status === "queued" ? " (waiting for another job)" : ""));
    setProgress(job.progress);
    await new Promise((ok) => setTimeout(ok, 250));
    r = await api(`/videos/${sid}/propagate/${job.job_id}`);
    if (!r.ok) {
      setStatus(await apiError(r), true);
      break;
    }
    job = await r.json();
    video.job = job;
  }
  video.job = null;
  setProgress(null);
  if (video.session && video.session.session_id === sid) {
    await refreshSession();
    await showFrame(video.frame);
  }
  updateControls();
  if (job.status === "done") {
    setStatus(`Propagated over ${job.done} frames in ${job.seconds.toFixed(1)} s: scrub with ` +
      "the slider; click to correct, then Propagate again.");
  } else if (job.status === "cancelled") {
    setStatus(`Propagation cancelled after ${job.done} of ${job.total} frames; those keep ` +
      "their results.");
  } else {
    setStatus(`Propagation ${job.status}${job.error ? ": " + job.error : ""}`, true);
  }
}

async function cancelPropagation() {
  if (!video.job || !video.session) return;
  const r = await api(`/videos/${video.session.session_id}/propagate/${video.job.job_id}`, {
    method: "DELETE",
  });
  if (!r.ok) setStatus(await apiError(r), true);
}

// -- downloads: fetched with the token, saved from a blob --

async function download(kind) {
  if (!video.session) return;
  const sid = video.session.session_id;
  const url = kind === "json" ? `/videos/${sid}/results.json` : `/videos/${sid}/overlay.mp4`;
  setStatus(kind === "json" ? "Preparing the results…" : "Rendering the overlay video…");
  const r = await api(url);
  if (!r.ok) {
    setStatus(await apiError(r), true);
    return;
  }
  const disposition = r.headers.get("Content-Disposition") || "";
  const m = /filename="?([^";]+)"?/.exec(disposition);
  const name = m ? m[1] : kind === "json" ? "results.json" : "overlay.mp4";
  const href = URL.createObjectURL(await r.blob());
  const a = document.createElement("a");
  a.href = href;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(href), 60_000);
  setStatus(`Saved ${name}.`);
}

// -- events --

function bindCanvas() {
  bindPointer($("prompt-canvas"), {
    active: () => Boolean(video.session),
    toCoords: toVideo,
    onDrag: (box) => drawPrompts(box),
    onRelease: ({ start, button, drag, box }) => {
      if (drag && button === 0 && !takesText()) {
        // SAM 2: the box of the selected object (with its clicks here), or of a new one
        if (box[2] > box[0] && box[3] > box[1]) objectPrompt({ box });
        else drawPrompts();
      } else if (drag && button === 0) {
        // an example box (with the text, if any): every instance that looks like it
        findText(box);
      } else if (!drag) {
        click(start.x, start.y, button === 2 || $("negative-toggle").checked);
      } else {
        drawPrompts();
      }
    },
  });
}

function bindControls() {
  $("file-input").addEventListener("change", (e) => openVideo(e.target.files[0]));
  $("text-form").addEventListener("submit", (e) => {
    e.preventDefault();
    findText();
  });
  $("new-object-button").addEventListener("click", () => {
    video.selected = null;
    if (video.session) updateObjects(video.session);
    setStatus("Click the new object.");
  });
  $("propagate-button").addEventListener("click", () => propagate());
  $("cancel-button").addEventListener("click", () => cancelPropagation());
  $("reset-button").addEventListener("click", () => resetVideo());
  $("json-button").addEventListener("click", () => download("json"));
  $("mp4-button").addEventListener("click", () => download("mp4"));
  $("frame-slider").addEventListener("input", (e) => showFrame(Number(e.target.value)));
  $("prev-button").addEventListener("click", () => showFrame(video.frame - 1));
  $("next-button").addEventListener("click", () => showFrame(video.frame + 1));
  document.addEventListener("keydown", (e) => {
    if (!video.session || e.target.tagName === "INPUT" && e.target.type === "text") return;
    if (e.key === "ArrowLeft") showFrame(video.frame - 1);
    else if (e.key === "ArrowRight") showFrame(video.frame + 1);
    else return;
    e.preventDefault();
  });
  const zone = $("drop-zone");
  for (const ev of ["dragenter", "dragover"]) {
    document.addEventListener(ev, (e) => {
      e.preventDefault();
      zone.classList.add("dragging");
    });
  }
  for (const ev of ["dragleave", "drop"]) {
    document.addEventListener(ev, (e) => {
      e.preventDefault();
      zone.classList.remove("dragging");
    });
  }
  document.addEventListener("drop", (e) => {
    const file = e.dataTransfer && e.dataTransfer.files[0];
    if (file) openVideo(file);
  });
}

bindCanvas();
bindControls();
loadHealth();
window.addEventListener("resize", fitStage);
window.addEventListener("hashchange", () => {
  if (!/(?:^#|&)token=/.test(window.location.hash)) return;
  TOKEN = readToken();
  loadHealth();
});
