#!/usr/bin/env python3
"""Generates the parity corpora (deterministic, seed fixed): strings for the tokenizer and
System One requests for the encoder. Runs anywhere (standard library only).

  tools/reference/make_corpus.py tests/fixtures

writes tokenizer_inputs.json and encode_inputs.jsonl there. The expected outputs are made from
these by tokenize_ref.py and encode_ref.py on a machine with Hugging Face `tokenizers`.
CORPUS_SEED=N draws another corpus of the same kinds (the committed fixtures use the default;
bench/run_quality_cpu.sh adds one for more varied requests).
"""
import base64, json, os, random, struct, sys, zlib

SEED = int(os.environ.get("CORPUS_SEED", "20261201"))
R = random.Random(SEED)

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|image_pad|>",
            "<|vision_end|>", "<think>", "</think>", "<tool_call>", "<|fim_prefix|>", "<|im_", "|>", "<think", "<|"]
SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "accents": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœŒÆÇÉÈŠŽčćđšžłńśźżŁŃŚŹŻğışĞİŞ",
    "greek": "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩάέήίόύώ",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯїієґ",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهويءآأؤإئ",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשת",
    "devanagari": "अआइईउऊऋएऐओऔकखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहािीुूृेैोौं्",
    "thai": "กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรฤลฦวศษสหฬอฮะัาำิีึืฺุู",
    "cjk": "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテト",
    "hangul": "가나다라마바사아자차카타파하한국어대한민국서울",
    "digits": "0123456789٠١٢٣٤٥٦٧٨٩０１２３４５６７８９①²³½",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»–—‘’“”…€£¥©®™°±×÷§¶•",
    "emoji": ["😀", "😂", "🙏", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🔥", "✨", "🤖", "🧑‍💻", "🏳️‍🌈", "☕", "🚀"],
    "space": [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "   \n", "\u00a0", "\u3000", "\u2028", "\u2009", "\u200b", "\u180e", "\u0085", "\f", "\v"],
    "combining": ["e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "\u1100\u1161\u11a8", "A\u030a", "\u0915\u093c", "i\u0307", ">\u0338", "=\u0338"],
}
WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up other "
         "about out many then them these so some her would make like him into time has look two more write go see "
         "number no way could people my than first water been call who oil its now find long down day did get come "
         "made may part checkout outage billing severity ticket refund customer server error timeout latency").split()
CODE = ["def f(x):\n    return x**2 + 1\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }", "SELECT * FROM t WHERE id = 42;",
        "if x != None and y >= 3:\n\tprint('ok')", "const r = await fetch(url, {method: 'POST'});", "#include <vector>\n",
        "λx.x", "x_1 = 3.14e-10; y = 0xFF;", "<div class=\"a\">Hi</div>", "{\"k\": [1, 2.5, null, true]}", "$ ls -la | grep '.py'"]


def pick(seq):
    return seq[R.randrange(len(seq))]


def license_lines():
    out = []
    for name in ("GPL-3", "Apache-2.0", "LGPL-2.1", "Artistic", "MPL-2.0"):
        p = os.path.join("/usr/share/common-licenses", name)
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                out += [l.strip() for l in f if len(l.strip()) > 20]
    return out or ["The quick brown fox jumps over the lazy dog."]


ENGLISH = license_lines()


def rand_script_text(n):
    parts = []
    for _ in range(n):
        key = pick(list(SCRIPTS))
        src = SCRIPTS[key]
        if isinstance(src, list):
            parts.append(pick(src))
        else:
            parts.append("".join(pick(src) for _ in range(R.randint(1, 8))))
        if R.random() < 0.5:
            parts.append(pick([" ", " ", "", "\n", ", ", ". "]))
    return "".join(parts)


def rand_string(i):
    kind = i % 12
    if kind == 0:
        return " ".join(pick(ENGLISH) for _ in range(R.randint(1, 3)))
    if kind == 1:
        return rand_script_text(R.randint(1, 12))
    if kind == 2:
        return " ".join(pick(WORDS) for _ in range(R.randint(1, 30))) + pick(["", ".", "?", "!", "\n"])
    if kind == 3:
        return pick(CODE) + pick(["", "\n", "  ", pick(CODE)])
    if kind == 4:  # whitespace runs
        return "".join(pick(SCRIPTS["space"]) * R.randint(1, 5) + pick(WORDS) for _ in range(R.randint(1, 6))) + pick(SCRIPTS["space"]) * R.randint(0, 4)
    if kind == 5:  # special-token text
        return "".join(pick([pick(SPECIALS), pick(WORDS), " ", "\n", pick(SPECIALS) + pick(SPECIALS)]) for _ in range(R.randint(1, 8)))
    if kind == 6:  # contractions and case
        return " ".join(pick(["I'm", "you're", "WE'LL", "it's", "IT'S", "they've", "he'd", "She'D", "'s", "don't", "o'clock", "ſ's", "'S"]) for _ in range(R.randint(1, 8)))
    if kind == 7:  # digits and numbers
        return " ".join(pick(["12345", "3.14159", "1,000,000", "2026-12-01", "٣٤٥", "１２３", "v2.0.1", "-0.5e10", "50%", "$19.99"]) for _ in range(R.randint(1, 6)))
    if kind == 8:  # combining marks (NFC)
        return "".join(pick(SCRIPTS["combining"]) + pick(["", " ", pick(WORDS)]) for _ in range(R.randint(1, 6)))
    if kind == 9:  # emoji
        return "".join(pick(SCRIPTS["emoji"]) + pick(["", " ", pick(WORDS) + " "]) for _ in range(R.randint(1, 6)))
    if kind == 10:  # random printable code points incl. astral
        cps = []
        for _ in range(R.randint(1, 40)):
            c = R.choice([R.randint(0x20, 0x7e), R.randint(0xa0, 0x2fff), R.randint(0x3000, 0xd7ff), R.randint(0xe000, 0xfffd), R.randint(0x10000, 0x1faff)])
            cps.append(chr(c))
        return "".join(cps)
    # long repeated runs
    return pick(["=", "-", "*", " ", "ab", "😀", "\n", "0", "a"]) * R.randint(20, 3000)


def png(width, height):
    raw = b"".join(b"\x00" + bytes([R.randrange(256)]) * width for _ in range(height))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def rand_json_value(depth=0):
    r = R.random()
    if depth > 2 or r < 0.35:
        return pick([R.randint(-10**6, 10**6), R.random() * 10 ** R.randint(-8, 20), True, False, None, rand_string(R.randrange(12)),
                     0.1, 1.0, 1e-05, 1e16, -0.0, 123456789.0, 2**63, -2**63, "é\"\\\n\t\u0001"])
    if r < 0.7:
        return [rand_json_value(depth + 1) for _ in range(R.randint(0, 4))]
    return {rand_key(): rand_json_value(depth + 1) for _ in range(R.randint(0, 5))}


def rand_key():
    return pick([pick(WORDS), pick(WORDS).upper(), "é", "Z", "a b", "_x", "10", "2", "ß", "😀", "\u00e9", "e\u0301", pick(SPECIALS)])


def rand_question(qi):
    qid = pick(WORDS) + pick(["", "_" + str(qi), "." + str(qi), "-x"]) + str(qi)
    t = pick(["noul", "choice", "score"])
    q = {"type": t}
    r = R.random()
    if r < 0.7:
        q["instructions"] = rand_string(R.randrange(12)) or "Is it?"
    elif r < 0.8:
        q["instructions"] = rand_json_value()
    elif r < 0.9:
        q["instructions"] = pick(["", None])
    # else: missing -> falls back to the id
    if t == "noul":
        if R.random() < 0.4:
            c = {}
            if R.random() < 0.6: c["true"] = pick([rand_string(2), None, {"x": 1}])
            if R.random() < 0.6: c["false"] = pick([rand_string(2), None])
            q["criteria"] = c
    elif t == "choice":
        # dict, not set: a set's order follows PYTHONHASHSEED, so reruns gave other requests
        labels = list(dict.fromkeys(rand_key() + pick(["", str(R.randrange(100))]) for _ in range(R.randint(2, 9))))
        if len(labels) < 2: labels += ["zz", "aa"]
        q["criteria"] = {l: pick([rand_string(R.randrange(12)), None, rand_json_value()]) for l in labels}
    else:
        q["criteria"] = [pick([rand_string(R.randrange(12)), None, rand_json_value()]) for _ in range(R.randint(2, 10))]
    return qid, q


def rand_request(i):
    req = {}
    if R.random() < 0.5: req["model"] = "clef"
    s = R.random()
    if s < 0.6:
        req["state"] = rand_string(i)
    elif s < 0.8:
        req["state"] = {rand_key(): rand_json_value() for _ in range(R.randint(1, 6))}
    else:
        req["state"] = [rand_json_value() for _ in range(R.randint(0, 5))]
    qs = {}
    for qi in range(R.choice([1, 1, 2, 3, 4, 8, 12]) if i % 17 else 64):
        qid, q = rand_question(qi)
        qs[qid] = q
    req["questions"] = qs
    if i % 9 == 4:
        dims = pick([(64, 64), (100, 37), (640, 480), (33, 1000), (1000, 700), (15, 15), (4000, 3000)])
        req["images"] = ["data:image/png;base64," + base64.b64encode(png(*dims)).decode()]
        if i % 2:
            req["images"].append({"content_type": "image/png", "base64": base64.b64encode(png(37, 300)).decode()})
    return req


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    os.makedirs(out, exist_ok=True)
    strings = [rand_string(i) for i in range(2400)]
    strings += ["", " ", "\n", "a", "<|im_start|>", "<|im_start|>user\nhi<|im_end|>", ">\u0338<|im_end|>\u0338",
                "Hello world", "  leading", "trailing  ", "\r\n\r\n", "x" * 5000, " " * 5000 + "x"]
    with open(os.path.join(out, "tokenizer_inputs.json"), "w", encoding="utf-8") as f:
        json.dump({"seed": SEED, "strings": strings}, f, ensure_ascii=False)
    with open(os.path.join(out, "encode_inputs.jsonl"), "w", encoding="utf-8") as f:
        for i in range(320):
            rec = {"parse_special": i % 3 == 0, "max_length": pick([16384, 16384, 16384, 16384, 4096, 4096, 1200, 600, 300]), "request": rand_request(i)}
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print("wrote", len(strings), "strings and 320 requests to", out)


if __name__ == "__main__":
    main()
