#!/usr/bin/env python3
"""The CPU engine's image oracle (run on the GPU machine: torch + transformers 5.17 + torchvision).

  make_vision_oracle.py QWEN3_TOKENIZER_JSON OUT_DIR

Writes OUT_DIR/tiny-v/ (a small random Clef folder whose vision tower matters: 2 blocks, an 8x8
position table resampled to every grid, config.json + model.safetensors saved by transformers'
Qwen3_5ForConditionalGeneration, preprocessor_config.json, the joint head, a cut tokenizer) and
OUT_DIR/tiny-v.expected.jsonl: per request the request (images as data URLs), input_ids, the
3-row position ids, each image's grid_thw and sha256 of its pixel_values (float32), and the fp32
probabilities of the reference: transformers' image processor (torchvision backend, CPU) + the
model's vision tower and backbone (eager attention, CPU) + make_oracle.py's joint head.
OUT_DIR/tiny-v.stages.pt holds the first requests' pixel_values, vision outputs and position ids
(for finding the stage where an engine departs; not a fixture).
"""
import base64, hashlib, io, json, os, sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import make_corpus  # noqa: E402
from encode_ref import encode_request, load_tokenizers  # noqa: E402
from make_oracle import make_head, perturb, qwen35_config, set_text_inv_freq, trim_tokenizer  # noqa: E402
from image_probe import PREPROCESSOR, scene  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
torch.set_num_threads(os.cpu_count() or 1)

CFG = dict(hidden=96, layers=4, ffn=160, q_heads=2, kv_heads=1, head_dim=48, k_heads=3, v_heads=3, k_dim=16, v_dim=24,
           mrope=[2, 2, 2], width=48, heads=4, head_ffn=96, routing=1, head_layers=1)
# 2 blocks of width 64 (2 heads of 32: 8 rotary frequencies per axis), an 8x8 position table
VISION = dict(depth=2, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=CFG["hidden"], patch_size=16,
              temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=64)


def data_url(img, fmt, **kw):
    from PIL import Image  # noqa: F401
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    mime = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[fmt]
    return f"data:{mime};base64," + base64.b64encode(b.getvalue()).decode()


def images_pool():
    from PIL import Image
    pool = []
    for i, (w, h, fmt) in enumerate([(64, 48, "PNG"), (300, 200, "JPEG"), (120, 330, "PNG"), (256, 256, "WEBP"),
                                     (40, 500, "PNG"), (333, 250, "JPEG"), (500, 90, "WEBP"), (17, 23, "PNG")]):
        kw = {"quality": 90} if fmt != "PNG" else {}
        pool.append(data_url(Image.fromarray(scene(w, h, 100 + i)), fmt, **kw))
    return pool


def main():
    from transformers import AutoImageProcessor, Qwen3_5ForConditionalGeneration
    tok_src, out = sys.argv[1:3]
    d = os.path.join(out, "tiny-v")
    os.makedirs(d, exist_ok=True)
    vocab = trim_tokenizer(tok_src, os.path.join(d, "tokenizer.json"))
    vocab = (vocab + 63) // 64 * 64
    config = qwen35_config(CFG, vocab)
    for k, v in VISION.items():
        setattr(config.vision_config, k, v)
    if hasattr(config.vision_config, "deepstack_visual_indexes"):
        config.vision_config.deepstack_visual_indexes = []
    full, plain = load_tokenizers(os.path.join(d, "tokenizer.json"))
    for t, attr in (("<|image_pad|>", "image_token_id"), ("<|vision_start|>", "vision_start_token_id"),
                    ("<|vision_end|>", "vision_end_token_id")):
        setattr(config, attr, full.token_to_id(t))
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    gen = torch.Generator().manual_seed(4242)
    perturb(model, gen)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump(PREPROCESSOR, f)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    print(f"tiny-v: vision config {model.config.vision_config.to_dict()}")
    print(f"tiny-v: visual keys {[k for k in model.state_dict() if 'visual' in k][:40]}")
    set_text_inv_freq(model, CFG, "tiny-v")
    head = make_head(CFG, gen, d)
    ip = AutoImageProcessor.from_pretrained(d)
    print(f"tiny-v: processor {type(ip).__name__} backend {getattr(ip, 'backend', '?')}")
    pool = images_pool()
    make_corpus.R.seed(7)
    captured = {}
    lm = model.model.language_model
    lm.register_forward_pre_hook(lambda mod, a, kw: captured.update(pos=kw.get("position_ids")), with_kwargs=True)
    stages = []
    E = model.lm_head.weight
    with open(os.path.join(out, "tiny-v.expected.jsonl"), "w", encoding="utf-8") as f, torch.no_grad():
        for i in range(24):
            r = make_corpus.rand_request(i)
            r.pop("images", None)
            if isinstance(r["state"], str) and len(r["state"]) > 600:
                r["state"] = r["state"][:600]
            r["questions"] = dict(list(r["questions"].items())[:4])
            n_img = [1, 2, 1, 3, 0, 4, 1, 2][i % 8]
            imgs = [pool[(i * 3 + k) % len(pool)] for k in range(n_img)]
            if i % 5 == 2 and imgs:  # the protocol's object form
                mime, b64 = imgs[0][5:].split(";base64,")
                imgs[0] = {"content_type": mime, "base64": b64}
            if imgs:
                r["images"] = imgs
            urls = [x if isinstance(x, str) else f"data:{x['content_type']};base64,{x['base64']}" for x in imgs]
            if urls:
                o = ip(urls, return_tensors="pt")
                pv, thw = o["pixel_values"].float(), o["image_grid_thw"]
                grids = thw.tolist()
            else:
                pv, thw, grids = None, None, []
            enc = encode_request(full, plain, r, grids=grids)
            ids = torch.tensor(enc["input_ids"])
            mm = (ids == full.token_to_id("<|image_pad|>")).int()[None]  # what the processor returns beside input_ids
            H = model.model(input_ids=ids[None], pixel_values=pv, image_grid_thw=thw, mm_token_type_ids=mm).last_hidden_state[0]
            probs = head(H, E, ids, enc)
            pos = captured["pos"]
            rec = {"request": r, "input_ids": enc["input_ids"], "grid_thw": grids, "probs": probs,
                   "position_ids": pos[-3:, 0].tolist() if pos is not None else None}
            if pv is not None:
                rec["pixel_values_sha256"] = hashlib.sha256(pv.contiguous().numpy().tobytes()).hexdigest()
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            if i < 4 and pv is not None:
                feats = model.model.get_image_features(pv, thw)
                feats = getattr(feats, "pooler_output", feats)
                stages.append({"pixel_values": pv, "grid_thw": thw, "image_features": feats, "position_ids": pos,
                               "hidden": H})
            print(f"tiny-v: request {i}: {len(enc['input_ids'])} tokens, grids {grids}, position rows "
                  f"{None if pos is None else list(pos.shape)}")
    torch.save(stages, os.path.join(out, "tiny-v.stages.pt"))


if __name__ == "__main__":
    main()
