#!/usr/bin/env python3
"""Expected `render()` outputs: Python's own json.dumps(json.loads(text), ensure_ascii=False,
separators=(",", ":"), sort_keys=True) over tricky and random JSON texts (standard library only).

  tools/reference/render_ref.py tests/fixtures/render_cases.jsonl
"""
import json, random, sys

R = random.Random(7)
TRICKY = [
    '0', '-0', '-0.0', '0.0', '1', '1.0', '1e5', '1E5', '1e-5', '1.5e-7', '0.0001', '0.00001', '1e16', '1e15',
    '123456789.0', '1234567890123456789', '9223372036854775807', '-9223372036854775808', '18446744073709551615',
    '0.1', '0.2', '0.30000000000000004', '1e22', '1e21', '1.7976931348623157e308', '5e-324', '2.2250738585072014e-308',
    '100000000000000000000.0', '9007199254740993.0', '3.141592653589793', '1e-7', '12345678901234567890.5', '-1.5E+300',
    'true', 'false', 'null', '""', '"a"', '"\\u00e9"', '"\\ud83d\\ude00"', '"\\u0000\\u0001\\u001f\\u007f"',
    '"\\b\\f\\n\\r\\t\\"\\\\\\/"', '"\u2028\u2029"', '"é😀ß中"', '[]', '{}', '[1,[2,[3,[]]]]',
    '{"b":1,"a":2,"A":3,"_":4,"é":5,"😀":6,"\\uffff":7,"10":8,"9":9,"":10}',
    '{"a":1,"a":2}', '{"z":{"y":1,"x":[{"d":1,"c":2}]},"a":null}', '[1.0, 2, "3", null, true, {"k": -0.0}]',
    '{"ab":1,"a":2,"abc":3,"b":4}', '"\\u00e9\\u0301"', '{"e\\u0301":1,"\\u00e9":2,"f":3}',
]


def rand_value(d=0):
    r = R.random()
    if d > 3 or r < 0.4:
        return R.choice([R.randint(-2**63, 2**64 - 1), R.random() * 10 ** R.randint(-30, 30), -R.random(), float(R.randint(0, 10**17)),
                         R.choice([True, False, None]), "".join(chr(R.choice([R.randint(0, 0x7f), R.randint(0x80, 0xd7ff), R.randint(0x10000, 0x10ffff)])) for _ in range(R.randint(0, 8)))])
    if r < 0.7:
        return [rand_value(d + 1) for _ in range(R.randint(0, 4))]
    return {"".join(chr(R.randint(0x20, 0x2ff)) for _ in range(R.randint(0, 4))): rand_value(d + 1) for _ in range(R.randint(0, 5))}


def main():
    out = sys.argv[1]
    cases = list(TRICKY)
    for _ in range(500):
        v = rand_value()
        cases.append(json.dumps(v, ensure_ascii=R.random() < 0.5, indent=R.choice([None, 1])))
    with open(out, "w", encoding="utf-8") as f:
        for text in cases:
            f.write(json.dumps({"json": text, "dumps": json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"), sort_keys=True)}, ensure_ascii=False) + "\n")
    print(f"render_ref: {len(cases)} cases")


if __name__ == "__main__":
    main()
