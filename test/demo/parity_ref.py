#!/usr/bin/env python3
"""Write the PyTorch reference for engine_parity_test.go: the tokens of a
fixed Go snippet, the target's logits for every position and the captured
outputs of the draft's target layers (from the exported HF folder).

  parity_ref.py TARGET_DIR OUT.json [--layers 1 3 5]
"""
import argparse, json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demomodel as dm, demotok

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = ("// Copyright 2009 The Go Authors. All rights reserved.\n\npackage bytes\n\n"
        "func (b *Buffer) Len() int { return len(b.buf) - b.off }\n\nfunc (b *Buffer) Reset() {\n\tb.buf = b.buf[:0]\n")

ap = argparse.ArgumentParser()
ap.add_argument("target")
ap.add_argument("out")
ap.add_argument("--layers", type=int, nargs="+", default=[1, 3, 5])
ap.add_argument("--make-random", action="store_true",
                help="first write a random-weight target (large weights, non-unit norms) to TARGET_DIR")
a = ap.parse_args()
tok = demotok.Tokenizer.load(os.path.join(HERE, "tokenizer"))
if a.make_random:
    torch.manual_seed(7)
    c = dm.target_config(len(tok), 64, 8, 4, 2, 32, 128, 4096, tok.specials[demotok.EOS])
    r = dm.Qwen3(c)
    with torch.no_grad():
        for n, p in r.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.15)
    dm.save_hf(a.target, r, c)
m = dm.load_hf(a.target, dm.Qwen3).eval()
ids = tok.encode(TEXT)
with torch.no_grad():
    logits, caps = m(torch.tensor([ids]), capture=a.layers)
json.dump({"tokens": ids, "logits": logits[0].tolist(), "layers": a.layers,
           "capture": torch.stack(caps, dim=2)[0].tolist()}, open(a.out, "w"))
print("wrote %s: %d tokens" % (a.out, len(ids)))
