// paddle-sam web page: open an image, click or drag to prompt, see the mask live.
// Plain browser JavaScript, no build step and no network beyond this server; common.js
// (loaded first) has the token, the API helpers, the status line and the RLE decoder.
"use strict";

const state = {
  health: null,
  file: null,            // kept to re-upload if the server evicted our session
  session: null,         // {session_id, width, height}
  points: [],            // [{x, y, label}]
  box: null,             // [x0, y0, x1, y1]
  history: [],           // snapshots of {points, box} for undo
  answer: null,          // last prompt response
  chosen: 0,             // index of the mask shown
  inFlight: false,
  pending: false,        // prompts changed while a request was running
  text: "",
};

const MASK_RGBA = [30, 144, 255, 128];

// -- model info --

async function loadHealth() {
  try {
    const r = await api("/health");
    if (r.status === 401) {
      $("model-info").textContent = "token needed";
      setStatus(NEEDS_TOKEN, true);
      return;
    }
    state.health = await r.json();
    const m = state.health.model;
    $("model-info").textContent =
      `model ${m.type} (${m.runtime}), ${state.health.threads ?? "?"} threads`;
    $("text-form").hidden = !m.takes_text;
    $("everything-button").hidden = !m.everything;
    $("video-link").hidden = !m.video;  // SAM 3 with its tracker: the video page
    // SAM 3: no points, and an answer is every instance found (no 1-of-3 choice)
    $("negative-label").hidden = m.takes_points === false;
    $("multimask-label").hidden = !!m.returns_instances;
    if (m.takes_points === false) {
      $("drop-hint-keys").textContent = "Type what to find, or drag a box around one example";
    }
  } catch (e) {
    $("model-info").textContent = "server unreachable";
  }
}

// -- upload --

function newUploadId() {
  if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
  return Array.from({ length: 24 }, () => Math.floor(Math.random() * 36).toString(36)).join("");
}

function upload(file) {
  // XMLHttpRequest rather than fetch: it reports upload progress
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    const form = new FormData();
    form.append("image", file, file.name || "image");
    const uploadId = newUploadId();
    xhr.open("POST", `/sessions?upload_id=${uploadId}`);
    if (TOKEN) xhr.setRequestHeader("Authorization", `Bearer ${TOKEN}`);
    xhr.responseType = "json";
    // the server counts image-encoder blocks; without that (exported models) the bar follows
    // the last embedding's duration
    const estimate = (state.health && state.health.last_embed_seconds) || null;
    let timer = null;
    let polling = false;
    const started = { t: 0 };
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) {
        setStatus(`Uploading ${file.name}… ${Math.round((100 * e.loaded) / e.total)}%`);
        setProgress(e.loaded / e.total);
      }
    };
    xhr.upload.onload = () => {
      started.t = performance.now();
      setProgress(estimate ? 0 : undefined);
      timer = setInterval(async () => {
        const s = (performance.now() - started.t) / 1000;
        let fraction = estimate ? Math.min(0.95, s / estimate) : undefined;
        if (!polling) {
          polling = true;
          try {
            const p = await (await api(`/uploads/${uploadId}`)).json();
            if (p.total) state.embedFraction = p.done / p.total;
          } catch (_) {
            // progress is a nicety: the upload itself reports any failure
          }
          polling = false;
        }
        if (state.embedFraction !== undefined) fraction = state.embedFraction;
        const pct = fraction !== undefined ? ` ${Math.round(100 * fraction)}%` : "";
        setStatus(`Computing the image embedding…${pct} (${s.toFixed(1)} s)`);
        setProgress(fraction);
      }, 250);
    };
    state.embedFraction = undefined;
    xhr.onload = () => {
      clearInterval(timer);
      if (xhr.status === 201) resolve(xhr.response);
      else if (xhr.status === 401) reject(new Error(NEEDS_TOKEN));
      else {
        const body = xhr.response || {};
        reject(new Error(body.detail || `upload failed (${xhr.status})`));
      }
    };
    xhr.onerror = () => {
      clearInterval(timer);
      reject(new Error("upload failed: server unreachable"));
    };
    xhr.send(form);
  });
}

async function openFile(file) {
  if (!file) return;
  if (state.session) {
    api(`/sessions/${state.session.session_id}`, { method: "DELETE" }).catch(() => {});
  }
  state.file = file;
  state.session = null;
  resetPrompts(false);
  setStatus(`Uploading ${file.name}…`);
  setProgress(0);
  let info;
  try {
    info = await upload(file);
  } catch (e) {
    setProgress(null);
    setStatus(e.message, true);
    return;
  }
  await showImage(file, info);
  state.session = info;
  setProgress(null);
  const notes = info.notes && info.notes.length ? ` (${info.notes.join("; ")})` : "";
  setStatus(
    `Ready: ${info.width}×${info.height}, embedding in ${info.embed_seconds.toFixed(2)} s. ` +
      `Click the object.${notes}`
  );
  $("stage").dataset.session = info.session_id;
  $("everything-button").disabled = false;
  loadHealth();
}

function showImage(file, info) {
  return new Promise((resolve) => {
    const url = URL.createObjectURL(file);
    const img = new Image();
    img.onload = () => {
      for (const id of ["image-canvas", "overlay-canvas", "prompt-canvas"]) {
        const c = $(id);
        c.width = info.width;   // the server's size (EXIF orientation applied)
        c.height = info.height;
      }
      $("image-canvas").getContext("2d").drawImage(img, 0, 0, info.width, info.height);
      URL.revokeObjectURL(url);
      $("stage").hidden = false;
      $("drop-hint").hidden = true;
      clearOverlay();
      drawPrompts();
      resolve();
    };
    img.onerror = () => {
      // the server read it but this browser cannot show it (e.g. TIFF): draw a blank canvas
      URL.revokeObjectURL(url);
      for (const id of ["image-canvas", "overlay-canvas", "prompt-canvas"]) {
        $(id).width = info.width;
        $(id).height = info.height;
      }
      $("stage").hidden = false;
      $("drop-hint").hidden = true;
      resolve();
    };
    img.src = url;
  });
}

// -- prompts --

function snapshot() {
  state.history.push({ points: state.points.map((p) => ({ ...p })), box: state.box });
}

function resetPrompts(redraw = true) {
  state.points = [];
  state.box = null;
  state.text = "";
  $("text-input").value = "";
  state.history = [];
  state.answer = null;
  if (redraw) {
    clearOverlay();
    drawPrompts();
  }
  updateButtons();
}

function updateButtons() {
  const any = state.points.length > 0 || state.box !== null || state.text !== "";
  $("undo-button").disabled = state.history.length === 0;
  $("reset-button").disabled = !any;
  const link = $("download-link");
  link.classList.toggle("disabled", !state.answer || state.answer.masks.length === 0);
}

function hasPrompt() {
  return state.points.length > 0 || state.box !== null || state.text !== "";
}

function toImage(e) {
  const c = $("prompt-canvas");
  const r = c.getBoundingClientRect();
  const x = ((e.clientX - r.left) / r.width) * c.width;
  const y = ((e.clientY - r.top) / r.height) * c.height;
  return {
    x: Math.min(Math.max(x, 0), c.width),
    y: Math.min(Math.max(y, 0), c.height),
  };
}

function drawPrompts(dragBox = null) {
  const c = $("prompt-canvas");
  const ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  const r = Math.max(4, Math.round(0.008 * Math.max(c.width, c.height)));
  const box = dragBox || state.box;
  if (box) {
    ctx.lineWidth = Math.max(2, r / 2);
    ctx.strokeStyle = "#00e676";
    ctx.strokeRect(box[0], box[1], box[2] - box[0], box[3] - box[1]);
  }
  for (const p of state.points) {
    ctx.beginPath();
    ctx.arc(p.x, p.y, r, 0, 2 * Math.PI);
    ctx.fillStyle = p.label === 1 ? "#00c853" : "#e53935";
    ctx.fill();
    ctx.lineWidth = Math.max(1, r / 3);
    ctx.strokeStyle = "#fff";
    ctx.stroke();
  }
  // the prompts as sent, for scripts and tests: [[x, y, label], ...] and [x0, y0, x1, y1]
  c.dataset.points = JSON.stringify(state.points.map((p) => [p.x, p.y, p.label]));
  c.dataset.box = JSON.stringify(state.box);
}

async function sendPrompt() {
  if (!state.session) return;
  if (state.inFlight) {
    state.pending = true;
    return;
  }
  if (!hasPrompt()) {
    state.answer = null;
    clearOverlay();
    updateButtons();
    return;
  }
  state.inFlight = true;
  const body = {
    points: state.points.map((p) => [p.x, p.y]),
    labels: state.points.map((p) => p.label),
    box: state.box,
    multimask: $("multimask-toggle").checked,
    outputs: ["png"],
  };
  if (state.text) body.text = state.text;
  const sid = state.session.session_id;
  try {
    const r = await api(`/sessions/${sid}/prompt`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (r.status === 410 && state.file) {
      setStatus("The server dropped this session; uploading the image again…", true);
      state.inFlight = false;
      const keep = { points: state.points, box: state.box };
      await openFile(state.file);
      Object.assign(state, keep);
      drawPrompts();
      return sendPrompt();
    }
    if (!r.ok) {
      setStatus(await apiError(r), true);
    } else {
      const answer = await r.json();
      state.answer = answer;
      state.chosen = answer.best;
      const timing = `${answer.timings_ms.total.toFixed(0)} ms (model ` +
        `${answer.timings_ms.model.toFixed(0)} ms)`;
      if (answer.instances) {
        await showInstances();
        const n = answer.masks.length;
        setStatus(n ? `${n} instance${n === 1 ? "" : "s"} in ${timing}`
          : `Nothing found above the confidence threshold (${timing})`);
      } else {
        await showMask();
        showChoices();
        setStatus(`${timing.replace(" (", " per click (")}`);
      }
    }
  } catch (e) {
    setStatus(`request failed: ${e.message}`, true);
  } finally {
    state.inFlight = false;
    updateButtons();
  }
  if (state.pending) {
    state.pending = false;
    sendPrompt();
  }
}

// -- mask overlay --

function clearOverlay() {
  const c = $("overlay-canvas");
  c.getContext("2d").clearRect(0, 0, c.width, c.height);
  delete c.dataset.score;
  delete c.dataset.area;
  $("score").textContent = "";
  $("mask-choices").textContent = "";
}

function decodePng(b64) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("could not decode the mask PNG"));
    img.src = `data:image/png;base64,${b64}`;
  });
}

function paintMask(alphaOf) {
  // alphaOf(i) tells whether pixel i (row-major) is inside the mask
  const c = $("overlay-canvas");
  const ctx = c.getContext("2d");
  const out = ctx.createImageData(c.width, c.height);
  let area = 0;
  for (let i = 0, n = c.width * c.height; i < n; i++) {
    if (alphaOf(i)) {
      out.data.set(MASK_RGBA, 4 * i);
      area++;
    }
  }
  ctx.putImageData(out, 0, 0);
  return area;
}

async function showMask() {
  const m = state.answer.masks[state.chosen];
  const img = await decodePng(m.png);
  const c = $("overlay-canvas");
  const tmp = document.createElement("canvas");
  tmp.width = c.width;
  tmp.height = c.height;
  const tctx = tmp.getContext("2d");
  tctx.drawImage(img, 0, 0);
  const px = tctx.getImageData(0, 0, c.width, c.height).data;
  const area = paintMask((i) => px[4 * i] > 127);
  c.dataset.score = m.score.toFixed(4);
  c.dataset.area = String(area);
  c.dataset.index = String(state.chosen);
  c.dataset.version = String(Number(c.dataset.version || 0) + 1);
  $("score").textContent = `score ${m.score.toFixed(3)} · ${area} px`;
  const link = $("download-link");
  link.href = `data:image/png;base64,${m.png}`;
  link.download = `mask_${state.chosen}.png`;
}

function instanceColor(k) {
  const j = k + 1;  // the best instance in a colour, not grey
  return [(j * 97) % 200 + 55, (j * 53) % 200 + 55, (j * 31) % 200 + 55, 140];
}

async function showInstances() {
  // every instance in its own colour (later ones under earlier, better ones); the union of
  // them is what the download gives
  const masks = state.answer.masks;
  const c = $("overlay-canvas");
  const ctx = c.getContext("2d");
  const out = ctx.createImageData(c.width, c.height);
  const tmp = document.createElement("canvas");
  tmp.width = c.width;
  tmp.height = c.height;
  const tctx = tmp.getContext("2d");
  const union = new Uint8Array(c.width * c.height);
  for (let k = masks.length - 1; k >= 0; k--) {
    const img = await decodePng(masks[k].png);
    tctx.clearRect(0, 0, c.width, c.height);
    tctx.drawImage(img, 0, 0);
    const px = tctx.getImageData(0, 0, c.width, c.height).data;
    const color = instanceColor(k);
    for (let i = 0, n = c.width * c.height; i < n; i++) {
      if (px[4 * i] > 127) {
        out.data.set(color, 4 * i);
        union[i] = 1;
      }
    }
  }
  ctx.putImageData(out, 0, 0);
  let area = 0;
  const png = tctx.createImageData(c.width, c.height);
  for (let i = 0; i < union.length; i++) {
    const v = union[i] ? 255 : 0;
    area += union[i];
    png.data.set([v, v, v, 255], 4 * i);
  }
  tctx.putImageData(png, 0, 0);
  c.dataset.score = masks.length ? masks[0].score.toFixed(4) : "";
  c.dataset.area = String(area);
  c.dataset.count = String(masks.length);
  c.dataset.index = "";
  c.dataset.version = String(Number(c.dataset.version || 0) + 1);
  $("score").textContent = masks.length ? `${masks.length} found · ${area} px` : "";
  const box = $("mask-choices");
  box.textContent = "";
  masks.forEach((m, k) => {
    const chip = document.createElement("span");
    chip.className = "instance";
    const [r, g, b] = instanceColor(k);
    chip.style.borderColor = `rgb(${r}, ${g}, ${b})`;
    chip.textContent = `#${k + 1}: ${m.score.toFixed(3)}`;
    box.appendChild(chip);
  });
  const link = $("download-link");
  link.href = tmp.toDataURL("image/png");
  link.download = "instances.png";
}

function showChoices() {
  const box = $("mask-choices");
  box.textContent = "";
  if (!state.answer || state.answer.masks.length < 2) return;
  state.answer.masks.forEach((m, i) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = `mask ${i + 1}: ${m.score.toFixed(3)}`;
    b.classList.toggle("chosen", i === state.chosen);
    b.onclick = async () => {
      state.chosen = i;
      await showMask();
      showChoices();
    };
    box.appendChild(b);
  });
}

// -- everything mode --

async function everything() {
  if (!state.session) return;
  const sid = state.session.session_id;
  $("everything-button").disabled = true;
  resetPrompts();
  let r = await api(`/sessions/${sid}/everything`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ points_per_side: 16 }),
  });
  if (!r.ok) {
    setStatus(await apiError(r), true);
    $("everything-button").disabled = false;
    return;
  }
  let job = await r.json();
  setProgress(0);
  while (job.status === "queued" || job.status === "running") {
    setStatus(`Segmenting everything… batch ${job.done} of ${job.total}`);
    setProgress(job.progress);
    await new Promise((ok) => setTimeout(ok, 300));
    r = await api(`/sessions/${sid}/everything/${job.job_id}`);
    if (!r.ok) {
      setStatus(await apiError(r), true);
      break;
    }
    job = await r.json();
  }
  setProgress(null);
  $("everything-button").disabled = false;
  if (job.status !== "done") {
    setStatus(`everything: ${job.status}${job.error ? ": " + job.error : ""}`, true);
    return;
  }
  const c = $("overlay-canvas");
  const ctx = c.getContext("2d");
  const out = ctx.createImageData(c.width, c.height);
  job.masks.forEach((m, k) => {
    const color = [(k * 97) % 200 + 55, (k * 53) % 200 + 55, (k * 31) % 200 + 55, 140];
    const [h] = m.segmentation.size;
    const counts = decodeCocoRle(m.segmentation);
    let idx = 0;
    counts.forEach((n, j) => {
      if (j % 2 === 1) {
        for (let t = idx; t < idx + n; t++) {
          const row = t % h;
          const col = (t - row) / h;
          out.data.set(color, 4 * (row * c.width + col));
        }
      }
      idx += n;
    });
  });
  ctx.putImageData(out, 0, 0);
  $("score").textContent = "";
  const n = job.masks.length;
  setStatus(`${n} mask${n === 1 ? "" : "s"} in ${job.seconds.toFixed(1)} s`);
}

// -- events --

function bindCanvas() {
  bindPointer($("prompt-canvas"), {
    active: () => Boolean(state.session),
    toCoords: toImage,
    onDrag: (box) => drawPrompts(box),
    onRelease: ({ start, button, drag, box }) => {
      snapshot();
      if (drag && button === 0) {
        state.box = box;
      } else if (!drag && state.health && state.health.model.takes_points === false) {
        state.history.pop();
        setStatus("This model takes no points (its checkpoint has no tracker weights for " +
          "SAM 3's point predictor): type what to find, or drag a box around one example.", true);
        return;
      } else if (!drag) {
        const negative = button === 2 || $("negative-toggle").checked;
        // a click segments one object (SAM 3: predict_inst); it replaces a text query
        state.text = "";
        $("text-input").value = "";
        state.points.push({ x: start.x, y: start.y, label: negative ? 0 : 1 });
      } else {
        state.history.pop();
        drawPrompts();
        return;
      }
      drawPrompts();
      updateButtons();
      sendPrompt();
    },
  });
}

function bindControls() {
  $("file-input").addEventListener("change", (e) => openFile(e.target.files[0]));
  $("undo-button").addEventListener("click", () => {
    const prev = state.history.pop();
    if (!prev) return;
    state.points = prev.points;
    state.box = prev.box;
    drawPrompts();
    updateButtons();
    sendPrompt();
  });
  $("reset-button").addEventListener("click", () => resetPrompts());
  $("multimask-toggle").addEventListener("change", () => sendPrompt());
  $("text-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.text = $("text-input").value.trim();
    if (state.text) state.points = []; // text finds every instance; clicks do not combine
    sendPrompt();
  });
  $("everything-button").addEventListener("click", () => everything());
  $("download-link").addEventListener("click", (e) => {
    if (!state.answer || state.answer.masks.length === 0) e.preventDefault();
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
    if (file) openFile(file);
  });
}

bindCanvas();
bindControls();
loadHealth();
// the address with #token=... pasted into this tab after it loaded without one
window.addEventListener("hashchange", () => {
  if (!/(?:^#|&)token=/.test(window.location.hash)) return;
  TOKEN = readToken();
  setStatus("Open an image (button or drag and drop).");
  loadHealth();
});
