#!/usr/bin/env python3
"""A reference encoder written from spec/model.md section 3, over Hugging Face `tokenizers`.

  encode_ref.py TOKENIZER_JSON INPUTS_JSONL OUT_JSONL

Each input line is {"parse_special": bool, "max_length": N, "request": {...}}; each output line is
{"input_ids", "questions": [{"id","type","question_span","option_spans","option_ids"}],
 "images": [{"grid_thw","resized"}], "usage": {"input_tokens"}} or {"error": 413}.
With parse_special the user's text is tokenized with added tokens parsed (the reference);
without, user text goes through a copy of the tokenizer that has no added tokens.
"""
import base64, json, math, struct, sys

from tokenizers import Tokenizer

SYSTEM = ("Read the complete state and schema. Decide every field jointly. Each answer must be exactly one "
          "of that field's allowed options.")
NOUL_TRUE = "The proposition is true or the answer is yes."
NOUL_FALSE = "The proposition is false or the answer is no."
PATCH, MERGE, MIN_PIXELS, MAX_PIXELS = 16, 2, 65536, 16777216

try:  # the image processor's own resize rule when transformers is present
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    RESIZE_SOURCE = "transformers"
except Exception:  # pragma: no cover
    RESIZE_SOURCE = "local"

    def smart_resize(height, width, factor, min_pixels, max_pixels):
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > max_pixels:
            beta = math.sqrt((height * width) / max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < min_pixels:
            beta = math.sqrt(min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar


def render(v):
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def image_bytes(img):
    if isinstance(img, str):
        return base64.b64decode(img.split(",", 1)[1])
    return base64.b64decode(img["base64"])


def load_tokenizers(tok_path):
    full = Tokenizer.from_file(tok_path)
    with open(tok_path, encoding="utf-8") as f:
        spec = json.load(f)
    spec["added_tokens"] = []
    return full, Tokenizer.from_str(json.dumps(spec))


def encode_request(full, plain, req, max_length=16384, parse_special=False, grids=None):
    """Returns {"input_ids", "questions", "images", "usage"} or {"error": 413}. grids: each
    image's [t, h, w] patch grid as the image processor made it (else PNG headers + smart_resize)."""
    user_tok = full if parse_special else plain
    vs, ve, pad = (full.token_to_id(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>"))

    def const(text):
        return full.encode(text, add_special_tokens=False).ids

    def user(text):
        return user_tok.encode(text, add_special_tokens=False).ids

    prefix = const("<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\nSTATE:\n")
    media, images = [], []
    for k, img in enumerate(req.get("images") or []):
        if grids is not None:
            _, gh, gw = grids[k]
            rh, rw = gh * PATCH, gw * PATCH
        else:
            w, h = png_size(image_bytes(img))
            rh, rw = smart_resize(h, w, factor=PATCH * MERGE, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
            gh, gw = rh // PATCH, rw // PATCH
        media += [vs] + [pad] * (gh * gw // (MERGE * MERGE)) + [ve]
        images.append({"grid_thw": [1, gh, gw], "resized": [rw, rh]})
    if media:
        media += const("\n")
    schema = const("\n\nSCHEMA FIELDS:\n")
    questions = []
    for i, (qid, q) in enumerate(req["questions"].items(), 1):
        t = q["type"]
        schema += user(f"\nFIELD {i}\nID: {qid}\nTYPE: {t}\nINSTRUCTION: ")
        ins = q.get("instructions")
        if ins is None or ins == "":
            ins = qid
        s = len(schema)
        schema += user(render(ins))
        qspan = [s, len(schema)]
        schema += const("\nALLOWED OPTIONS:\n")
        crit = q.get("criteria")
        if t == "noul":
            crit = crit or {}
            opts = [("true", crit.get("true", NOUL_TRUE)), ("false", crit.get("false", NOUL_FALSE))]
        elif t == "choice":
            opts = [(k, crit[k]) for k in sorted(crit)]
        else:
            opts = [(str(k), d) for k, d in enumerate(crit)]
        spans = []
        for j, (oid, d) in enumerate(opts, 1):
            schema += const(f"OPTION {j}: ")
            o = {"option_id": oid}
            if d is not None:
                o["description"] = d
            s = len(schema)
            schema += user(render(o))
            spans.append([s, len(schema)])
            schema += const("\n")
        schema += const("END FIELD\n")
        questions.append({"id": qid, "type": t, "question_span": qspan, "option_spans": spans,
                          "option_ids": [o[0] for o in opts]})
    suffix = const("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:")
    fixed = len(prefix) + len(media) + len(schema) + len(suffix)
    if fixed > max_length:
        return {"error": 413}
    state = user(render(req["state"]))[: max_length - fixed]
    base = len(prefix) + len(media) + len(state)
    for q in questions:
        q["question_span"] = [x + base for x in q["question_span"]]
        q["option_spans"] = [[a + base, b + base] for a, b in q["option_spans"]]
    ids = prefix + media + state + schema + suffix
    return {"input_ids": ids, "questions": questions, "images": images, "usage": {"input_tokens": len(ids)}}


def main():
    tok_path, inputs, out = sys.argv[1:4]
    full, plain = load_tokenizers(tok_path)
    n = 0
    with open(inputs, encoding="utf-8") as fin, open(out, "w", encoding="utf-8") as fout:
        for line in fin:
            rec = json.loads(line)
            res = encode_request(full, plain, rec["request"], rec["max_length"], rec["parse_special"])
            fout.write((json.dumps(res) if "error" in res else json.dumps(res, ensure_ascii=False, separators=(",", ":"))) + "\n")
            n += 1
    print(f"encode_ref: {n} requests (image resize from {RESIZE_SOURCE})")


if __name__ == "__main__":
    main()
