#!/usr/bin/env python3
"""Write testdata/tokenizer_golden.json: texts and the ids demotok gives them
(tokenizer_test.go checks that sdk/tokenizer agrees). With --text FILE
--out OUT it writes the same kind of file for an arbitrary text (split into
chunks on NUL), for a larger local check: DEMO_TOK_GOLDEN=OUT go test ./test/demo/."""
import argparse, json, lzma, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demotok

HERE = os.path.dirname(os.path.abspath(__file__))
TEXTS = [
    "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tfmt.Println(\"hello, world\")\n}\n",
    "// Copyright 2009 The Go Authors. All rights reserved.\n// Use of this source code is governed by a BSD-style\n",
    "func (b *Buffer) Write(p []byte) (n int, err error) {\n\tb.lastRead = opInvalid\n",
    "x := 12345 + 0x7fff // it's   spaces\t\ttabs\r\n\r\n  \n   end   ",
    "héllo wörld ünïcode «quotes» — 日本語 ₂ ½ e\u0301 NFC",
    "<|im_start|>user\nwrite a loop<|im_end|>\n<|im_start|>assistant\n",
    "don't we'll I'M THEY'RE 'tis <|mask|><|endoftext|>",
    "",
]

ap = argparse.ArgumentParser()
ap.add_argument("--text")
ap.add_argument("--out", default=os.path.join(HERE, "testdata", "tokenizer_golden.json"))
a = ap.parse_args()
texts = TEXTS
if a.text:
    op = lzma.open if a.text.endswith(".xz") else open
    with op(a.text, "rt", encoding="utf-8") as f:
        texts = f.read().split("\0")
tok = demotok.Tokenizer.load(os.path.join(HERE, "tokenizer"))
cases = [{"text": t, "ids": tok.encode(t)} for t in texts]
for c in cases:
    assert tok.decode(c["ids"]) == __import__("unicodedata").normalize("NFC", c["text"]), c["text"][:80]
with open(a.out, "w", encoding="utf-8") as f:
    json.dump(cases, f, ensure_ascii=False, indent=0 if not a.text else None)
print("wrote %s: %d texts, %d tokens" % (a.out, len(cases), sum(len(c["ids"]) for c in cases)))
