#!/usr/bin/env python3
"""The image processor's reference behaviour (run on the GPU machine: transformers 5.17, torch,
torchvision, Pillow). Issue 19 / docs/notes/image-processor-reference.md.

  image_probe.py OUT_DIR

Writes OUT_DIR/corpus/*.{png,jpg,webp,gif,bmp} (generated, real-world-like: gradients, shapes,
noise; every colour type, EXIF orientations, elongated and 16 MP images), OUT_DIR/expected.jsonl
(per file: what the processor does with it as a data URL, the way clefrt receives images: the
decoded size and sha256 of the decoded RGB bytes, the resized size and sha256 of the resized
uint8 RGB bytes, grid_thw, sha256 of pixel_values as float32, or the error it raises),
OUT_DIR/resized/*.npy (the reference's resized arrays, for debugging a mismatch), OUT_DIR/src/
(inspect.getsource of the functions that decide the pixels), and OUT_DIR/probe.txt (the
checklist's answers).
"""
import base64, hashlib, inspect, io, json, math, os, sys, tempfile

import numpy as np
import torch
import torchvision
import transformers
import PIL
from PIL import Image

PREPROCESSOR = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"}
MIME = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp", "gif": "image/gif", "bmp": "image/bmp"}


def sha(b):
    return hashlib.sha256(b).hexdigest()


def scene(w, h, seed, noise=6.0):
    """Photo-like content: two-axis gradients, a few discs and bars, mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(0, 6.28)
        img[..., c] = 128 + 90 * np.sin(a * x / max(w, 1) * 6 + b * y / max(h, 1) * 6 + p)
    for _ in range(4):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.05, 0.3) * min(w, h) + 1
        m = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        img[m] = rng.uniform(0, 255, 3)
    x0 = int(rng.uniform(0, w))
    img[:, x0:x0 + max(1, w // 20)] = rng.uniform(0, 255, 3)
    img += rng.normal(0, noise, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def ramps(w, h):
    """Large but compressible (PNG's Sub / Up filters make linear ramps nearly free): R a ramp
    in x, G a ramp in y, B in 64-pixel blocks."""
    y, x = np.mgrid[0:h, 0:w]
    return np.dstack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x // 64 + y // 64) % 4) * 60]).astype(np.uint8)


def exif_with_orientation(o):
    ex = Image.Exif()
    ex[0x0112] = o
    return ex.tobytes()


def corpus(out):
    """(name, bytes) pairs."""
    items = []

    def save(name, img, fmt, **kw):
        b = io.BytesIO()
        img.save(b, fmt, **kw)
        items.append((name, b.getvalue()))

    rgb = lambda w, h, s, **k: Image.fromarray(scene(w, h, s, **k))
    for (w, h) in [(16, 16), (31, 47), (200, 150), (333, 500), (1024, 768), (80, 2000), (2000, 15), (15, 2000)]:
        save(f"rgb-{w}x{h}.png", rgb(w, h, w * 7 + h), "PNG")
    save("rgb-300x200-noise.png", Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 300, 3), np.uint8)), "PNG")
    a = scene(120, 90, 5)
    alpha = np.tile(np.linspace(0, 255, 160, dtype=np.float32)[None, :], (100, 1)).astype(np.uint8)
    save("rgba-120x90.png", Image.fromarray(np.dstack([a, alpha[:90, :120]]), "RGBA"), "PNG")
    save("la-100x70.png", Image.fromarray(np.dstack([a[:70, :100, 0], alpha[:70, :100]]), "LA"), "PNG")
    save("l-130x85.png", Image.fromarray(a[:85, :, 1]).resize((130, 85)), "PNG")
    save("one-bit-64x40.png", Image.fromarray(a[:40, :64, 2] > 128), "PNG")
    p = rgb(150, 100, 9).quantize(64)
    save("p-150x100.png", p, "PNG")
    p2 = rgb(90, 60, 10).quantize(16)
    save("p-trns-90x60.png", p2, "PNG", transparency=3)
    g16 = (np.linspace(0, 65535, 96 * 64).reshape(64, 96)).astype(np.uint16)
    save("i16-96x64.png", Image.fromarray(g16), "PNG")
    for (w, h) in [(640, 480), (333, 500)]:
        save(f"jpeg-420-{w}x{h}.jpg", rgb(w, h, w + h), "JPEG", quality=90)
    save("jpeg-444-300x200.jpg", rgb(300, 200, 3), "JPEG", quality=95, subsampling=0)
    save("jpeg-422-301x199.jpg", rgb(301, 199, 4), "JPEG", quality=85, subsampling=1)
    save("jpeg-progressive-400x300.jpg", rgb(400, 300, 6), "JPEG", quality=88, progressive=True)
    save("jpeg-gray-250x180.jpg", rgb(250, 180, 7).convert("L"), "JPEG", quality=90)
    save("jpeg-cmyk-120x80.jpg", rgb(120, 80, 8).convert("CMYK"), "JPEG", quality=90)
    for o in (3, 6, 8):
        save(f"jpeg-exif{o}-240x160.jpg", rgb(240, 160, 20 + o), "JPEG", quality=90, exif=exif_with_orientation(o))
    save("png-exif6-120x80.png", rgb(120, 80, 30), "PNG", exif=exif_with_orientation(6))
    save("jpeg-12mp-4000x3000.jpg", rgb(4000, 3000, 11, noise=0.0), "JPEG", quality=60)
    save("png-16mp-4096x4096.png", Image.fromarray(ramps(4096, 4096)), "PNG")
    save("png-24mp-6000x4000.png", Image.fromarray(ramps(6000, 4000)), "PNG")
    save("webp-lossy-320x240.webp", rgb(320, 240, 14), "WEBP", quality=80)
    save("webp-lossless-200x120.webp", rgb(200, 120, 15), "WEBP", lossless=True)
    save("webp-alpha-160x100.webp", Image.fromarray(np.dstack([scene(160, 100, 16), alpha[:100, :160]]), "RGBA"), "WEBP", quality=90)
    save("webp-alpha-lossless-64x48.webp", Image.fromarray(np.dstack([scene(64, 48, 17), alpha[:48, :64]]), "RGBA"), "WEBP", lossless=True)
    save("gif-100x80.gif", rgb(100, 80, 18).quantize(32), "GIF")
    save("bmp-50x40.bmp", rgb(50, 40, 19), "BMP")
    os.makedirs(os.path.join(out, "corpus"), exist_ok=True)
    for name, b in items:
        with open(os.path.join(out, "corpus", name), "wb") as f:
            f.write(b)
    return items


def dump_sources(out, log):
    d = os.path.join(out, "src")
    os.makedirs(d, exist_ok=True)
    import transformers.image_utils as iu
    import transformers.image_processing_backends as ib
    from transformers.models.qwen2_vl import image_processing_qwen2_vl as q2
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    targets = {"image_utils.py": iu, "image_processing_backends.py": ib, "image_processing_qwen2_vl.py": q2, "modeling_qwen3_5.py": mq}
    try:
        from transformers.models.qwen3_5 import configuration_qwen3_5 as cq
        targets["configuration_qwen3_5.py"] = cq
    except Exception as e:
        log(f"no configuration_qwen3_5: {e}")
    for fname, mod in targets.items():
        with open(os.path.join(d, fname), "w") as f:
            f.write(inspect.getsource(mod))
    log(f"load_image_as_tensor present: {hasattr(iu, 'load_image_as_tensor')}")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(str(s))

    log(f"transformers {transformers.__version__} torch {torch.__version__} torchvision {torchvision.__version__} PIL {PIL.__version__}")
    ckpt = tempfile.mkdtemp()
    with open(os.path.join(ckpt, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f)
    from transformers import AutoImageProcessor
    ip = AutoImageProcessor.from_pretrained(ckpt)
    log(f"class {type(ip).__name__} backend {getattr(ip, 'backend', '?')} size {dict(ip.size)} resample {ip.resample} "
        f"mean {ip.image_mean} patch {ip.patch_size} merge {ip.merge_size} convert_rgb {ip.do_convert_rgb} rescale {ip.rescale_factor}")
    ipp = AutoImageProcessor.from_pretrained(ckpt, backend="pil")
    log(f"pil twin class {type(ipp).__name__}")
    dump_sources(out, log)
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    for h, w in [(80, 2000), (144, 1040), (1365, 2048), (15, 2000), (8000, 8000), (10, 2001), (10, 2000), (48, 48), (4000, 6000)]:
        try:
            log(f"smart_resize {h}x{w} -> {smart_resize(h, w, 32, 65536, 16777216)}")
        except ValueError as e:
            log(f"smart_resize {h}x{w} -> ValueError {e}")
    items = corpus(out)
    os.makedirs(os.path.join(out, "resized"), exist_ok=True)
    with open(os.path.join(out, "expected.jsonl"), "w") as fo:
        for name, b in items:
            ext = name.rsplit(".", 1)[1]
            url = f"data:{MIME[ext]};base64," + base64.b64encode(b).decode()
            rec = {"file": name, "bytes_sha256": sha(b), "pil_mode": Image.open(io.BytesIO(b)).mode,
                   "pil_size": list(Image.open(io.BytesIO(b)).size)}
            try:
                fetched = ip.fetch_images(url)
                if isinstance(fetched, list):
                    fetched = fetched[0]
                rec["fetched_type"] = type(fetched).__name__
                if isinstance(fetched, Image.Image):
                    rec["fetched_mode"] = fetched.mode
                    arr = np.asarray(fetched.convert("RGB") if fetched.mode != "RGB" else fetched)
                else:
                    t = fetched if isinstance(fetched, torch.Tensor) else torch.as_tensor(fetched)
                    rec["fetched_dtype"] = str(t.dtype)
                    rec["fetched_shape"] = list(t.shape)
                    arr = t.permute(1, 2, 0).contiguous().numpy() if t.shape[0] in (1, 3, 4) and t.dim() == 3 else t.numpy()
                rec["decoded"] = [int(arr.shape[1]), int(arr.shape[0])]
                rec["decoded_sha256"] = sha(np.ascontiguousarray(arr).tobytes())
                o = ip(url, return_tensors="pt")
                pv, thw = o["pixel_values"], o["image_grid_thw"]
                rec["grid_thw"] = thw[0].tolist()
                rec["pixel_values_sha256"] = sha(pv.float().contiguous().numpy().tobytes())
                gh, gw = rec["grid_thw"][1], rec["grid_thw"][2]
                # undo the patch layout and the normalisation: exact for (x - 127.5) / 127.5 on uint8
                x = pv.reshape(gh // 2, gw // 2, 2, 2, 3, 2, 16, 16)[..., 0, :, :]
                x = x.permute(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * 16, gw * 16)  # (bh,bw,mh,mw,c,y,x) -> (c,bh,mh,y,bw,mw,x)
                u = x * 127.5 + 127.5
                ur = torch.round(u)
                rec["inverse_exact"] = bool(torch.equal(u, ur))
                hw = ur.to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
                rec["resized"] = [gw * 16, gh * 16]
                rec["resized_sha256"] = sha(hw.tobytes())
                if hw.size <= 1 << 18:
                    np.save(os.path.join(out, "resized", name + ".npy"), hw)
                # the same resize from the fetched pixels by hand: torch CPU uint8 bicubic AA
                tin = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)[None]
                if [gh * 16, gw * 16] != [tin.shape[2], tin.shape[3]]:
                    t2 = torch.nn.functional.interpolate(tin, (gh * 16, gw * 16), mode="bicubic", antialias=True)
                else:
                    t2 = tin
                rec["by_hand_equal"] = bool(np.array_equal(t2[0].permute(1, 2, 0).numpy(), hw))
                tin_c = tin.contiguous()
                t3 = torch.nn.functional.interpolate(tin_c, (gh * 16, gw * 16), mode="bicubic", antialias=True) \
                    if [gh * 16, gw * 16] != [tin.shape[2], tin.shape[3]] else tin_c
                rec["contiguous_equal"] = bool(torch.equal(t2, t3))
                pim = Image.fromarray(np.ascontiguousarray(arr)).resize((gw * 16, gh * 16), Image.BICUBIC)
                rec["pil_resize_maxdiff"] = int(np.abs(np.asarray(pim).astype(int) - hw.astype(int)).max())
                ppil = ipp(url, return_tensors="pt")["pixel_values"]
                rec["pil_backend_maxdiff"] = float((ppil - pv).abs().max())
                if torch.cuda.is_available() and arr.size < 4_000_000:
                    pc = ip(url, return_tensors="pt", device="cuda")["pixel_values"].cpu()
                    rec["cuda_maxdiff"] = float((pc - pv).abs().max())
                # what a PIL object passed directly gives (no EXIF transpose in that path)
                pd = ip(Image.open(io.BytesIO(b)), return_tensors="pt")["pixel_values"]
                rec["pil_object_equal"] = bool(pd.shape == pv.shape and torch.equal(pd, pv))
            except Exception as e:  # the reference's refusal is part of the behaviour
                rec["error"] = f"{type(e).__name__}: {e}"[:400]
            log(json.dumps({k: v for k, v in rec.items() if not k.endswith("sha256")}))
            fo.write(json.dumps(rec) + "\n")
    # the chat-template path with a data URL gives the same pixels as the processor
    try:
        from transformers import AutoProcessor
        log("AutoProcessor needs a tokenizer folder: skipped here (make_vision_oracle.py covers the model path)")
    except Exception as e:
        log(f"AutoProcessor: {e}")
    with open(os.path.join(out, "probe.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
