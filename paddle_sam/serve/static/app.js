// paddle-sam web page: open an image and label it: several objects, each with a class name
// and its own colour, each segmented by clicks, a box or (SAM 3) a text prompt; export them as
// COCO JSON or YOLO segmentation labels, or one mask as PNG.
// Plain browser JavaScript, no build step and no network beyond this server; common.js
// (loaded first) has the token, the API helpers, the status line and the RLE decoder.
"use strict";

const state = {
  health: null,
  configured: false,     // the controls were set from /health once
  file: null,            // kept to re-upload if the server evicted our session
  session: null,         // {session_id, width, height}
  objects: [],           // see newObject
  selected: null,        // the id of the object that clicks, boxes and text go to
  nextId: 1,
  nextQuery: 1,
  inFlight: false,
  pending: null,         // an object whose prompts changed while a request was running
  unsaved: false,        // objects changed since the last export
  threshold: null,       // SAM 3's confidence threshold sent with prompts
  classes: loadClasses(), // class names in id order, kept for this tab (ids equal across images)
};

// saturated colours that stay visible on photos; each mask also gets an opaque ring of its
// colour and a dark edge outside that, so that no colour vanishes on a similar background
const PALETTE = [
  [30, 144, 255], [255, 45, 45], [40, 200, 80], [255, 204, 0], [190, 70, 255],
  [255, 140, 0], [0, 210, 210], [255, 40, 170], [150, 220, 0], [90, 90, 255],
];
const FILL_ALPHA = 100;
const SELECTED_FILL_ALPHA = 150;
const EDGE_RGBA = [0, 0, 0, 235];

// -- model info --

function knownPhrase() {
  // a phrase the loaded model knows, for the text box's placeholder
  const vocab = state.health && state.health.model.vocabulary;
  if (vocab && vocab.length) return vocab.find((p) => p.includes(" ")) || vocab[0];
  return "person";
}

function configure(m) {
  $("text-form").hidden = !m.takes_text;
  $("everything-tools").hidden = !m.everything;
  $("video-link").hidden = !m.video;  // SAM 2, or SAM 3 with its tracker: the video page
  // SAM 3: an answer to text is every instance found (no 1-of-3 choice); points only when
  // the checkpoint has the tracker's heads
  $("negative-label").hidden = m.takes_points === false;
  $("multimask-label").hidden = !!m.returns_instances;
  $("text-input").placeholder = `text prompt, e.g. '${knownPhrase()}'`;
  const list = $("vocabulary");
  list.textContent = "";
  for (const phrase of m.vocabulary || []) {
    const o = document.createElement("option");
    o.value = phrase;
    list.appendChild(o);
  }
  const hasThreshold = typeof m.confidence_threshold === "number";
  $("confidence-label").hidden = !hasThreshold;
  if (hasThreshold) setConfidence(m.confidence_threshold);
  if (m.generator) {
    $("points-per-side").value = m.generator.points_per_side;
    $("pred-iou").value = m.generator.pred_iou_thresh;
    $("stability").value = m.generator.stability_score_thresh;
  }
  const banner = $("demo-banner");
  banner.hidden = !m.demo;
  if (m.demo) {
    let text = `Demo model: ${m.demo}.`;
    if (m.vocabulary && m.vocabulary.length) {
      text += ` The phrases it knows: ${m.vocabulary.join(", ")}.`;
    }
    banner.textContent = text;
  }
  $("drop-hint-keys").textContent = promptHelp();
}

function promptHelp() {
  const m = state.health ? state.health.model : {};
  if (m.takes_points === false) {
    return m.takes_text
      ? `Type what to find (e.g. '${knownPhrase()}'), or drag a box around one example.`
      : "Drag a box around the object.";
  }
  const text = m.takes_text ? ", or type what to find" : "";
  return "Click an object (right click: a negative point) or drag a box around it" + text +
    "; '+ New object' starts the next one.";
}

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
    if (!state.configured) {
      configure(m);
      state.configured = true;
    }
  } catch (e) {
    $("model-info").textContent = "server unreachable";
  }
}

function setConfidence(value) {
  // the threshold sent: the server's own until the slider moves (which rounds to its steps)
  state.threshold = Number(value);
  $("confidence-input").value = String(value);
  $("confidence-value").textContent = state.threshold.toFixed(2);
}

function confidence() {
  return $("confidence-label").hidden ? null : state.threshold;
}

// -- class names (ids kept for this tab, so that they agree across the images labelled) --

function loadClasses() {
  try {
    const v = JSON.parse(sessionStorage.getItem("paddle-sam-classes") || "[]");
    return Array.isArray(v) ? v.filter((n) => typeof n === "string") : [];
  } catch (_) {
    return [];
  }
}

function saveClasses() {
  try {
    sessionStorage.setItem("paddle-sam-classes", JSON.stringify(state.classes));
  } catch (_) {
    // storage disabled: the list lives as long as the page
  }
  const p = $("class-list");
  p.hidden = state.classes.length === 0;
  p.textContent = "";
  if (!state.classes.length) return;
  p.append(`Class ids (COCO id − 1, YOLO id), kept for this tab: ` +
    state.classes.map((n, i) => `${i} ${n}`).join(" · ") + " ");
  const forget = document.createElement("button");
  forget.type = "button";
  forget.className = "link";
  forget.textContent = "forget";
  forget.title = "start the class list again from the next export";
  forget.onclick = () => {
    state.classes = [];
    saveClasses();
  };
  p.append(forget);
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
  const labelled = state.objects.filter((o) => o.mask).length;
  if (state.unsaved && labelled) {
    const current = state.file ? state.file.name : "this image";
    const ok = window.confirm(`Open ${file.name}? The ${labelled} object` +
      `${labelled === 1 ? "" : "s"} labelled on ${current} since the last export will be ` +
      "discarded.");
    if (!ok) return;
  }
  if (state.session) {
    api(`/sessions/${state.session.session_id}`, { method: "DELETE" }).catch(() => {});
  }
  state.file = file;
  state.session = null;
  clearObjects();
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
  selectObject(newObject().id);
  const notes = info.notes && info.notes.length ? ` (${info.notes.join("; ")})` : "";
  setStatus(
    `Ready: ${info.width}×${info.height}, embedding in ${info.embed_seconds.toFixed(2)} s. ` +
      `${promptHelp()}${notes}`
  );
  $("stage").dataset.session = info.session_id;
  $("everything-button").disabled = false;
  $("add-object-button").disabled = false;
  loadHealth();
}

async function reupload() {
  // the server dropped our session (memory budget, idle time): the same image again, the
  // objects kept (their masks are the page's)
  setStatus("The server dropped this session; uploading the image again…", true);
  const info = await upload(state.file);
  state.session = info;
  $("stage").dataset.session = info.session_id;
}

function showImage(file, info) {
  return new Promise((resolve) => {
    const url = URL.createObjectURL(file);
    const img = new Image();
    const done = () => {
      URL.revokeObjectURL(url);
      $("stage").hidden = false;
      $("drop-hint").hidden = true;
      renderOverlay();
      drawPrompts();
      resolve();
    };
    for (const id of ["image-canvas", "overlay-canvas", "prompt-canvas"]) {
      $(id).width = info.width;   // the server's size (EXIF orientation applied)
      $(id).height = info.height;
    }
    img.onload = () => {
      $("image-canvas").getContext("2d").drawImage(img, 0, 0, info.width, info.height);
      done();
    };
    // the server read it but this browser cannot show it (e.g. TIFF): a blank canvas
    img.onerror = done;
    img.src = url;
  });
}

// -- objects --

function newObject(fields = {}) {
  const id = state.nextId++;
  const o = {
    id,
    name: `object ${id}`,
    color: PALETTE[(id - 1) % PALETTE.length],
    points: [],        // [{x, y, label}]
    box: null,         // [x0, y0, x1, y1]
    text: "",
    history: [],       // snapshots of {points, box, text} for undo
    answer: null,      // the last /prompt answer with candidate masks (clicks, a box)
    chosen: 0,         // which of them is the object's mask
    query: null,       // the text / exemplar query that found it (SAM 3), shared by its finds
    mask: null,        // {rle, png (base64 or null), score, area}
    layers: null,      // its pixels for drawing (maskLayers)
    pngUrl: null,      // its mask as a PNG data URL, when drawn here
    ...fields,
  };
  state.objects.push(o);
  return o;
}

function objectById(id) {
  return state.objects.find((o) => o.id === id) || null;
}

function selectedObject() {
  return objectById(state.selected);
}

function isDefaultName(o) {
  return o.name === `object ${o.id}`;
}

function className(o) {
  return o.name.trim() || `object ${o.id}`;
}

function clearObjects() {
  state.objects = [];
  state.selected = null;
  state.pending = null;
  state.unsaved = false;
  renderList();
  renderOverlay();
  drawPrompts();
  updateButtons();
}

function selectObject(id) {
  state.selected = id;
  const o = selectedObject();
  $("text-input").value = o ? o.text : "";
  renderList();
  renderOverlay();
  drawPrompts();
  showChoices();
  updateButtons();
}

function addObject() {
  const o = selectedObject();
  // an empty selected object is the next one already
  if (o && !o.mask && !o.points.length && !o.box && !o.text) {
    setStatus(`${className(o)}: ${promptHelp()}`);
    return;
  }
  const fresh = newObject();
  selectObject(fresh.id);
  setStatus(`${className(fresh)}: ${promptHelp()}`);
  const input = document.querySelector(`#object-list li[data-id="${fresh.id}"] input`);
  if (input) input.focus();
}

function deleteObject(id) {
  const k = state.objects.findIndex((o) => o.id === id);
  if (k < 0) return;
  const [gone] = state.objects.splice(k, 1);
  if (gone.mask) state.unsaved = true;
  if (state.pending === id) state.pending = null;
  if (state.selected === id) {
    const next = state.objects[Math.min(k, state.objects.length - 1)];
    state.selected = next ? next.id : newObject().id;
  }
  selectObject(state.selected);
  renderOverlay(true);
  setStatus(`Deleted ${className(gone)}.`);
}

function setMask(o, mask) {
  o.mask = mask;
  o.layers = null;
  o.pngUrl = null;
  state.unsaved = true;
}

function renderList() {
  const list = $("object-list");
  // a name being typed keeps its focus and caret through the rebuild
  const typing = list.contains(document.activeElement) ? document.activeElement : null;
  const focus = typing && typing.classList.contains("name")
    ? { id: typing.closest("li").dataset.id, start: typing.selectionStart,
      end: typing.selectionEnd }
    : null;
  list.textContent = "";
  for (const o of state.objects) {
    const li = document.createElement("li");
    li.className = "object" + (o.id === state.selected ? " selected" : "");
    li.dataset.id = String(o.id);
    li.style.setProperty("--c", `rgb(${o.color.join(", ")})`);
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    const name = document.createElement("input");
    name.className = "name";
    name.type = "text";
    name.value = o.name;
    name.setAttribute("aria-label", `class name of object ${o.id}`);
    name.setAttribute("list", "vocabulary");
    name.addEventListener("focus", () => {
      if (state.selected !== o.id) selectObject(o.id);
    });
    name.addEventListener("input", () => {
      o.name = name.value;
      state.unsaved = true;
      updateButtons();
    });
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = o.mask
      ? `${o.mask.area} px · ${o.mask.score.toFixed(3)}`
      : (o.points.length || o.box || o.text ? "nothing found" : "empty");
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "×";
    del.title = `delete ${className(o)}`;
    del.setAttribute("aria-label", `delete object ${o.id}`);
    del.addEventListener("click", (e) => {
      e.stopPropagation();
      deleteObject(o.id);
    });
    li.append(swatch, name, meta, del);
    li.addEventListener("click", () => {
      if (state.selected !== o.id) selectObject(o.id);
    });
    list.appendChild(li);
  }
  if (focus) {
    const input = list.querySelector(`li[data-id="${focus.id}"] input.name`);
    if (input) {
      input.focus();
      input.setSelectionRange(focus.start, focus.end);
    }
  }
}

// -- prompts --

function snapshot(o) {
  o.history.push({ points: o.points.map((p) => ({ ...p })), box: o.box, text: o.text });
}

function hasPrompt(o) {
  return Boolean(o) && (o.points.length > 0 || o.box !== null || o.text !== "");
}

function updateButtons() {
  const o = selectedObject();
  $("undo-button").disabled = !o || o.history.length === 0;
  $("reset-button").disabled = !hasPrompt(o) && !(o && o.mask);
  const link = $("download-link");
  const mask = o && o.mask;
  link.classList.toggle("disabled", !mask);
  if (mask) {
    link.href = maskPngUrl(o);
    link.download = `${fileStem(o)}.png`;
    link.textContent = `Download ${className(o)}`;
  } else {
    link.href = "#";
    link.textContent = "Download mask";
  }
  const any = state.objects.some((x) => x.mask);
  $("export-coco").disabled = !any;
  $("export-yolo").disabled = !any;
}

function fileStem(o) {
  // the name the page shows; a name shared by several objects gets the object's number
  const slug = (name) => name.replace(/[^\p{L}\p{N}._-]+/gu, "_").replace(/^[._]+|_+$/g, "");
  const mine = slug(className(o)) || `object_${o.id}`;
  const shared = state.objects.some((x) => x !== o && slug(className(x)) === mine);
  return shared ? `${mine}_${o.id}` : mine;
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
  const o = selectedObject();
  const points = o ? o.points : [];
  const r = Math.max(4, Math.round(0.008 * Math.max(c.width, c.height)));
  const box = dragBox || (o && o.box);
  if (box) {
    ctx.lineWidth = Math.max(2, r / 2);
    ctx.strokeStyle = "#00e676";
    ctx.strokeRect(box[0], box[1], box[2] - box[0], box[3] - box[1]);
  }
  for (const p of points) {
    ctx.beginPath();
    ctx.arc(p.x, p.y, r, 0, 2 * Math.PI);
    ctx.fillStyle = p.label === 1 ? "#00c853" : "#e53935";
    ctx.fill();
    ctx.lineWidth = Math.max(1, r / 3);
    ctx.strokeStyle = "#fff";
    ctx.stroke();
  }
  // the selected object's prompts as sent, for scripts and tests: [[x, y, label], ...] and
  // [x0, y0, x1, y1]
  c.dataset.points = JSON.stringify(points.map((p) => [p.x, p.y, p.label]));
  c.dataset.box = JSON.stringify(o ? o.box : null);
  c.dataset.selected = o ? String(o.id) : "";
}

function isQuery(o) {
  // SAM 3 grounding (every instance) rather than one object's candidates: text and/or an
  // exemplar box, no clicks
  const m = state.health ? state.health.model : {};
  return Boolean(m.returns_instances) && !o.points.length && (o.text !== "" || o.box !== null);
}

async function sendPrompt(o = selectedObject()) {
  if (!state.session || !o) return;
  if (state.inFlight) {
    state.pending = o.id;
    return;
  }
  if (!hasPrompt(o)) {
    o.answer = null;
    setMask(o, null);
    finishChange(o);
    return;
  }
  state.inFlight = true;
  const body = {
    points: o.points.map((p) => [p.x, p.y]),
    labels: o.points.map((p) => p.label),
    box: o.box,
    multimask: $("multimask-toggle").checked,
    outputs: ["png", "rle"],
  };
  if (o.text) body.text = o.text;
  const threshold = confidence();
  if (threshold !== null) body.confidence_threshold = threshold;
  try {
    let r = await postPrompt(body);
    if (r.status === 410 && state.file) {
      await reupload();
      r = await postPrompt(body);
    }
    if (!r.ok) {
      setStatus(await apiError(r), true);
    } else if (objectById(o.id)) {  // not deleted meanwhile
      const answer = await r.json();
      const timing = `${answer.timings_ms.total.toFixed(0)} ms (model ` +
        `${answer.timings_ms.model.toFixed(0)} ms)`;
      if (answer.instances) {
        applyQuery(o, answer);
        const n = answer.masks.length;
        if (n) {
          setStatus(`${n} instance${n === 1 ? "" : "s"} in ${timing}` +
            (n > 1 ? `: objects ${queryObjects(o.query).map((x) => x.id).join(", ")}` : ""));
        } else {
          setStatus(nothingFound(o, answer, timing), true);
        }
      } else {
        o.answer = answer;
        o.query = null;
        o.chosen = answer.best;
        setMask(o, answer.masks[o.chosen]);
        setStatus(`${timing.replace(" (", " per click (")}`);
      }
      finishChange(o);
    }
  } catch (e) {
    setStatus(`request failed: ${e.message}`, true);
  } finally {
    state.inFlight = false;
    updateButtons();
  }
  if (state.pending !== null) {
    const next = objectById(state.pending);
    state.pending = null;
    if (next) sendPrompt(next);
  }
}

function postPrompt(body) {
  return api(`/sessions/${state.session.session_id}/prompt`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

function nothingFound(o, answer, timing) {
  const thr = answer.confidence_threshold;
  let text = `Nothing found above the confidence threshold ${thr.toFixed(2)} (${timing})`;
  const vocab = state.health.model.vocabulary;
  if (o.text && vocab && !vocab.includes(o.text.trim().toLowerCase())) {
    text += `: '${o.text}' is not a phrase this demo model knows (try '${knownPhrase()}')`;
  } else {
    text += ": move the confidence slider down for weaker matches";
  }
  return text;
}

function queryObjects(query) {
  return state.objects.filter((x) => x.query === query);
}

function applyQuery(o, answer) {
  // SAM 3 found every instance of o's text (and/or exemplar box): o holds the best one and
  // each other becomes an object of the same class; the objects of o's earlier answer to
  // this query are reused (names, colours), those left over removed
  const query = o.query || state.nextQuery++;
  const others = state.objects.filter((x) => x.query === query && x !== o);
  if (o.text && isDefaultName(o)) o.name = o.text;
  o.query = query;
  o.answer = null;
  const masks = answer.masks;
  setMask(o, masks.length ? masks[0] : null);
  state.objects = state.objects.filter((x) => !others.includes(x));
  let at = state.objects.indexOf(o) + 1;
  for (let k = 1; k < masks.length; k++) {
    let x = others.shift();
    if (!x) {
      x = newObject({ query });
      state.objects.pop();
    }
    Object.assign(x, { name: o.name, text: o.text, box: o.box, points: [], history: [] });
    setMask(x, masks[k]);
    state.objects.splice(at++, 0, x);
  }
  if (others.length) state.unsaved = true;
}

function finishChange(o) {
  if (o.id === state.selected) {
    showChoices();
    drawPrompts();
  }
  renderList();
  renderOverlay(true);
  updateButtons();
}

// -- the overlay: every object in its colour, the selected one on top --

function decodeMask(rle, W, H) {
  // COCO RLE (column-major) -> row-major 0/1 pixels and the box around them
  const bits = new Uint8Array(W * H);
  const box = { x0: W, y0: H, x1: -1, y1: -1 };
  let idx = 0;
  decodeCocoRle(rle).forEach((n, j) => {
    if (j % 2 === 1 && n > 0) {
      for (let t = idx; t < idx + n; t++) {
        const row = t % H;
        const col = (t - row) / H;
        bits[row * W + col] = 1;
      }
      const c0 = Math.floor(idx / H);
      const c1 = Math.floor((idx + n - 1) / H);
      box.x0 = Math.min(box.x0, c0);
      box.x1 = Math.max(box.x1, c1);
      if (c1 > c0) {
        box.y0 = 0;
        box.y1 = H - 1;
      } else {
        box.y0 = Math.min(box.y0, idx % H);
        box.y1 = Math.max(box.y1, (idx + n - 1) % H);
      }
    }
    idx += n;
  });
  return { bits, box };
}

function maskLayers(o, W, H, t) {
  // the mask's pixels by how far they are from its edge (city-block distance, the outside
  // and the image's border at 0): <= t the dark edge, <= 2t an opaque ring of the object's
  // colour, further in the translucent fill
  const { bits, box } = decodeMask(o.mask.rle, W, H);
  const idx = [];
  const kind = [];
  if (box.x1 >= 0) {
    const w = box.x1 - box.x0 + 1;
    const h = box.y1 - box.y0 + 1;
    const cap = 2 * t + 1;
    const d = new Uint16Array(w * h);
    for (let y = 0; y < h; y++) {
      for (let x = 0; x < w; x++) {
        if (!bits[(box.y0 + y) * W + box.x0 + x]) continue;
        const up = y > 0 ? d[(y - 1) * w + x] : 0;
        const left = x > 0 ? d[y * w + x - 1] : 0;
        d[y * w + x] = Math.min(up, left, cap - 1) + 1;
      }
    }
    for (let y = h - 1; y >= 0; y--) {
      for (let x = w - 1; x >= 0; x--) {
        const k = y * w + x;
        if (!d[k]) continue;
        const down = y < h - 1 ? d[k + w] : 0;
        const right = x < w - 1 ? d[k + 1] : 0;
        d[k] = Math.min(d[k], down + 1, right + 1);
        idx.push((box.y0 + y) * W + box.x0 + x);
        kind.push(d[k] <= t ? 3 : d[k] <= 2 * t ? 2 : 1);
      }
    }
  }
  return { t, idx: Int32Array.from(idx), kind: Uint8Array.from(kind) };
}

function edgeWidth(c) {
  // about 2 screen pixels for each ring, whatever the image's display scale
  const shown = c.getBoundingClientRect().width;
  return Math.max(1, Math.round((shown > 0 ? c.width / shown : 1) * 1.5));
}

function renderOverlay(changed = false) {
  // changed: the objects' masks changed (data-version counts those redraws)
  const c = $("overlay-canvas");
  const W = c.width;
  const H = c.height;
  const ctx = c.getContext("2d");
  const out = ctx.createImageData(W, H);
  const data = out.data;
  const t = edgeWidth(c);
  const sel = selectedObject();
  const order = state.objects.filter((o) => o.mask && o !== sel);
  if (sel && sel.mask) order.push(sel);
  let area = 0;
  for (const o of order) {
    if (!o.layers || o.layers.t !== t) o.layers = maskLayers(o, W, H, t);
    const [r, g, b] = o.color;
    const fill = [r, g, b, o === sel ? SELECTED_FILL_ALPHA : FILL_ALPHA];
    const ring = [r, g, b, 255];
    const { idx, kind } = o.layers;
    for (let k = 0; k < idx.length; k++) {
      const p = 4 * idx[k];
      if (data[p + 3] === 0) area++;
      data.set(kind[k] === 1 ? fill : kind[k] === 2 ? ring : EDGE_RGBA, p);
    }
  }
  ctx.putImageData(out, 0, 0);
  // what is drawn, for scripts and tests: the pixels covered, the selected object's score
  c.dataset.area = String(area);
  c.dataset.count = String(order.length);
  c.dataset.score = sel && sel.mask ? sel.mask.score.toFixed(4) : "";
  c.dataset.index = sel && sel.answer ? String(sel.chosen) : "";
  if (changed) c.dataset.version = String(Number(c.dataset.version || 0) + 1);
  $("score").textContent = sel && sel.mask
    ? `score ${sel.mask.score.toFixed(3)} · ${sel.mask.area} px (${className(sel)})` : "";
}

function maskPngUrl(o) {
  // the server's PNG when it sent one, else drawn here once (0 / 255 grey levels)
  if (o.mask.png) return `data:image/png;base64,${o.mask.png}`;
  if (o.pngUrl) return o.pngUrl;
  const c = $("overlay-canvas");
  const { bits } = decodeMask(o.mask.rle, c.width, c.height);
  const tmp = document.createElement("canvas");
  tmp.width = c.width;
  tmp.height = c.height;
  const ctx = tmp.getContext("2d");
  const img = ctx.createImageData(c.width, c.height);
  for (let i = 0; i < bits.length; i++) {
    const v = bits[i] ? 255 : 0;
    img.data.set([v, v, v, 255], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
  o.pngUrl = tmp.toDataURL("image/png");
  return o.pngUrl;
}

function showChoices() {
  const box = $("mask-choices");
  box.textContent = "";
  const o = selectedObject();
  if (!o || !o.answer || o.answer.masks.length < 2) return;
  o.answer.masks.forEach((m, i) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = `mask ${i + 1}: ${m.score.toFixed(3)}`;
    b.classList.toggle("chosen", i === o.chosen);
    b.onclick = () => {
      o.chosen = i;
      setMask(o, o.answer.masks[i]);
      finishChange(o);
    };
    box.appendChild(b);
  });
}

// -- everything mode: every mask found becomes an object --

function generatorOptions() {
  const options = {};
  for (const [key, id] of [["points_per_side", "points-per-side"],
    ["pred_iou_thresh", "pred-iou"], ["stability_score_thresh", "stability"]]) {
    const v = $(id).value;
    if (v !== "") options[key] = Number(v);
  }
  return options;
}

async function everything() {
  if (!state.session) return;
  $("everything-button").disabled = true;
  const options = generatorOptions();
  const start = () => api(`/sessions/${state.session.session_id}/everything`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(options),
  });
  let r;
  try {
    r = await start();
    if (r.status === 410 && state.file) {
      await reupload();
      r = await start();
    }
  } catch (e) {
    setStatus(`request failed: ${e.message}`, true);
    $("everything-button").disabled = false;
    return;
  }
  if (!r.ok) {
    setStatus(await apiError(r), true);
    $("everything-button").disabled = false;
    return;
  }
  const sid = state.session.session_id;
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
  if (state.session.session_id !== sid) return;  // another image was opened meanwhile
  const empty = selectedObject();
  for (const m of job.masks) {
    const o = newObject();
    setMask(o, { rle: m.segmentation, png: null, score: m.predicted_iou, area: m.area });
  }
  if (empty && !empty.mask && !hasPrompt(empty) && job.masks.length) {
    // the empty object that was waiting for clicks goes after them: the next one to label
    state.objects.splice(state.objects.indexOf(empty), 1);
    state.objects.push(empty);
  }
  renderList();
  renderOverlay(true);
  updateButtons();
  const n = job.masks.length;
  let text = `${n} mask${n === 1 ? "" : "s"} in ${job.seconds.toFixed(1)} s`;
  if (n === 0) {
    text += `: none passed the filters (pred IoU ≥ ${options.pred_iou_thresh}, stability ≥ ` +
      `${options.stability_score_thresh}); lower them under 'options'`;
  } else {
    text += ": each is an object, rename or delete them";
  }
  setStatus(text, n === 0);
}

// -- exports --

function exportBody() {
  const labelled = state.objects.filter((o) => o.mask && o.mask.area > 0);
  const names = labelled.map(className);
  for (const n of names) {
    if (!state.classes.includes(n)) state.classes.push(n);
  }
  saveClasses();
  return {
    skipped: state.objects.length - labelled.length,
    body: {
      file_name: state.file ? state.file.name : "image.png",
      width: state.session.width,
      height: state.session.height,
      objects: labelled.map((o, k) => ({ name: names[k], rle: o.mask.rle })),
      classes: state.classes,
    },
  };
}

async function exportObjects(format) {
  if (!state.session) return;
  const { skipped, body } = exportBody();
  let r;
  try {
    r = await api(`/export/${format}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
  } catch (e) {
    setStatus(`export failed: ${e.message}`, true);
    return;
  }
  if (!r.ok) {
    setStatus(await apiError(r), true);
    return;
  }
  const stem = body.file_name.replace(/\.[^.]*$/, "") || "image";
  saveBlob(await r.blob(), `${stem}.${format === "coco" ? "json" : "txt"}`);
  state.unsaved = false;
  const n = body.objects.length;
  const what = format === "coco" ? "COCO JSON" : "YOLO labels";
  setStatus(`${what}: ${n} object${n === 1 ? "" : "s"}` +
    (skipped ? ` (${skipped} without a mask left out)` : "") +
    `; classes ${body.classes.map((c, i) => `${format === "coco" ? i + 1 : i} ${c}`)
      .join(", ")}`);
}

function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// -- events --

function bindCanvas() {
  bindPointer($("prompt-canvas"), {
    active: () => Boolean(state.session),
    toCoords: toImage,
    onDrag: (box) => drawPrompts(box),
    onRelease: ({ start, button, drag, box }) => {
      let o = selectedObject();
      if (!o) {
        o = newObject();
        selectObject(o.id);
      }
      if (!drag && state.health && state.health.model.takes_points === false) {
        setStatus("This model takes no points (its checkpoint has no tracker weights for " +
          "SAM 3's point predictor): type what to find, or drag a box around one example.", true);
        return;
      }
      if (drag && button !== 0) {
        drawPrompts();
        return;
      }
      snapshot(o);
      if (drag) {
        o.box = box;
      } else {
        const negative = button === 2 || $("negative-toggle").checked;
        // a click segments one object (SAM 3: predict_inst); it replaces a text query
        if (o.text || o.query) {
          o.text = "";
          o.query = null;
          $("text-input").value = "";
        }
        o.points.push({ x: start.x, y: start.y, label: negative ? 0 : 1 });
      }
      drawPrompts();
      updateButtons();
      sendPrompt(o);
    },
  });
}

function bindControls() {
  $("file-input").addEventListener("change", (e) => {
    openFile(e.target.files[0]);
    e.target.value = "";  // the same file again is a change too
  });
  $("undo-button").addEventListener("click", () => {
    const o = selectedObject();
    const prev = o && o.history.pop();
    if (!prev) return;
    Object.assign(o, prev);
    $("text-input").value = o.text;
    drawPrompts();
    updateButtons();
    sendPrompt(o);
  });
  $("reset-button").addEventListener("click", () => {
    const o = selectedObject();
    if (!o) return;
    if (hasPrompt(o)) snapshot(o);
    Object.assign(o, { points: [], box: null, text: "", answer: null, query: null });
    $("text-input").value = "";
    setMask(o, null);
    finishChange(o);
  });
  $("multimask-toggle").addEventListener("change", () => sendPrompt());
  $("text-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const o = selectedObject();
    const text = $("text-input").value.trim();
    if (!o || !text) return;
    snapshot(o);
    o.text = text;
    o.points = []; // text finds every instance; clicks do not combine with it
    drawPrompts();
    sendPrompt(o);
  });
  $("confidence-input").addEventListener("input", () => setConfidence($("confidence-input").value));
  $("confidence-input").addEventListener("change", () => {
    setConfidence($("confidence-input").value);
    const o = selectedObject();
    if (o && isQuery(o)) sendPrompt(o);
  });
  $("everything-button").addEventListener("click", () => everything());
  $("add-object-button").addEventListener("click", () => addObject());
  $("export-coco").addEventListener("click", () => exportObjects("coco"));
  $("export-yolo").addEventListener("click", () => exportObjects("yolo"));
  $("download-link").addEventListener("click", (e) => {
    const o = selectedObject();
    if (!o || !o.mask) e.preventDefault();
  });
  window.addEventListener("beforeunload", (e) => {
    if (state.unsaved && state.objects.some((o) => o.mask)) e.preventDefault();
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
  // the rings' width follows the display scale
  window.addEventListener("resize", () => {
    if (state.session) renderOverlay();
  });
}

bindCanvas();
bindControls();
saveClasses();
loadHealth();
// the address with #token=... pasted into this tab after it loaded without one
window.addEventListener("hashchange", () => {
  if (!/(?:^#|&)token=/.test(window.location.hash)) return;
  TOKEN = readToken();
  setStatus("Open an image (button or drag and drop).");
  loadHealth();
});
