// The SAM web demo's decoder step in plain JavaScript, for the test that drives this page.
//
// As the demo does: the image's size and its scale to the model's long side read from an
// <img>, the image embedding read from a .npy file into an ort.Tensor, the decoder loaded with
// InferenceSession.create, and for each set of clicks float32 feeds (clicks times the scale, a
// padding point (0, 0) labelled -1, a zero mask_input, has_mask_input 0, orig_im_size
// [height, width]); the FIRST output is the mask, thresholded at 0 and drawn on a canvas.
// A box is fed as the notebook feeds it: its corners labelled 2 and 3 after the clicks, and
// then no padding point.
//
// The test's server gives /data/config.json: {model, image, embedding, longSide, maskSize};
// longSide and maskSize are the model's input side and low-res mask side (1024 and 256 for
// the released models). The page sets window.demoReady (a promise) and window.segment.

"use strict";

const status = (text) => {
  document.getElementById("status").textContent = text;
};

// the image's size and its scale to the model's long side
const imageScale = (img, longSide) => {
  const width = img.naturalWidth;
  const height = img.naturalHeight;
  return { height, width, samScale: longSide / Math.max(height, width) };
};

const loadImage = (url) =>
  new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error(`could not load the image ${url}`));
    img.src = url;
  });

// a little-endian float32 .npy file (format versions 1 to 3) as an ort.Tensor
const loadNpyTensor = async (url) => {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const buffer = await response.arrayBuffer();
  const bytes = new Uint8Array(buffer);
  const magic = String.fromCharCode(...bytes.subarray(1, 6));
  if (bytes[0] !== 0x93 || magic !== "NUMPY") throw new Error(`${url} is not a .npy file`);
  const view = new DataView(buffer);
  const major = bytes[6];
  const headerLength = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const headerStart = major === 1 ? 10 : 12;
  const header = new TextDecoder().decode(bytes.subarray(headerStart, headerStart + headerLength));
  const descr = /'descr':\s*'([^']*)'/.exec(header);
  if (!descr || descr[1] !== "<f4") throw new Error(`${url}: float32 expected, got ${header}`);
  if (/'fortran_order':\s*True/.test(header)) throw new Error(`${url}: C order expected`);
  const shape = /'shape':\s*\(([^)]*)\)/
    .exec(header)[1]
    .split(",")
    .filter((s) => s.trim() !== "")
    .map(Number);
  const data = new Float32Array(buffer.slice(headerStart + headerLength));
  return new ort.Tensor("float32", data, shape);
};

// the decoder's feeds for clicks [{x, y, clickType}] (pixels of the original image) and an
// optional box [x0, y0, x1, y1]
const modelData = (clicks, box, embedding, modelScale, maskSize) => {
  const corners = box ? [
    { x: box[0], y: box[1], clickType: 2 },
    { x: box[2], y: box[3], clickType: 3 },
  ] : [];
  const points = [...clicks, ...corners];
  const n = points.length;
  const pad = box ? 0 : 1; // the padding point only when there is no box
  const pointCoords = new Float32Array(2 * (n + pad));
  const pointLabels = new Float32Array(n + pad);
  for (let i = 0; i < n; i++) {
    pointCoords[2 * i] = points[i].x * modelScale.samScale;
    pointCoords[2 * i + 1] = points[i].y * modelScale.samScale;
    pointLabels[i] = points[i].clickType;
  }
  if (pad) {
    pointCoords[2 * n] = 0.0;
    pointCoords[2 * n + 1] = 0.0;
    pointLabels[n] = -1.0;
  }
  return {
    image_embeddings: embedding,
    point_coords: new ort.Tensor("float32", pointCoords, [1, n + pad, 2]),
    point_labels: new ort.Tensor("float32", pointLabels, [1, n + pad]),
    orig_im_size: new ort.Tensor("float32", [modelScale.height, modelScale.width]),
    mask_input: new ort.Tensor(
      "float32", new Float32Array(maskSize * maskSize), [1, 1, maskSize, maskSize]
    ),
    has_mask_input: new ort.Tensor("float32", [0]),
  };
};

// the first height x width values of a mask output, thresholded at 0, drawn on the canvas
const drawMask = (data, height, width) => {
  const rgba = new Uint8ClampedArray(4 * width * height);
  for (let i = 0; i < width * height; i++) {
    if (data[i] > 0.0) rgba.set([0, 114, 189, 255], 4 * i);
  }
  const canvas = document.getElementById("mask");
  canvas.width = width;
  canvas.height = height;
  canvas.getContext("2d").putImageData(new ImageData(rgba, width, height), 0, 0);
};

const setUp = async () => {
  const config = await (await fetch("/data/config.json")).json();
  // the WebAssembly files come from this server, one thread (the page is not cross-origin
  // isolated, so there is no SharedArrayBuffer for more)
  ort.env.wasm.wasmPaths = new URL("/ort/", location.origin).href;
  ort.env.wasm.numThreads = 1;
  const [img, embedding, session] = await Promise.all([
    loadImage(config.image),
    loadNpyTensor(config.embedding),
    ort.InferenceSession.create(config.model, { executionProviders: ["wasm"] }),
  ]);
  const modelScale = imageScale(img, config.longSide);

  // runs the decoder for the prompts; returns the feeds, the outputs' names, the first
  // output's dims with every value thresholded at 0 (a '0'/'1' string), the IoU predictions
  // and the displayed canvas's size
  window.segment = async (clicks, box = null) => {
    const feeds = modelData(clicks, box, embedding, modelScale, config.maskSize);
    const results = await session.run(feeds);
    const output = results[session.outputNames[0]];
    const [, , height, width] = output.dims;
    drawMask(output.data, height, width);
    let bits = "";
    for (const v of output.data) bits += v > 0.0 ? "1" : "0";
    return {
      outputNames: session.outputNames,
      inputNames: session.inputNames,
      dims: output.dims,
      bits,
      scores: Array.from(results.iou_predictions.data),
      feeds: Object.fromEntries(
        Object.entries(feeds).map(([k, t]) => [
          k, { type: t.type, dims: t.dims, data: k === "image_embeddings" ? [] : Array.from(t.data) },
        ])
      ),
      modelScale,
    };
  };
  status("ready");
};

window.demoReady = setUp().catch((e) => {
  status(`error: ${e.message}`);
  throw e;
});
