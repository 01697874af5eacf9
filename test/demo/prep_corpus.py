#!/usr/bin/env python3
"""Build the demo corpus (run on a CPU machine, not the GPU machine).

Deterministic sample of the Go standard library's own source (.go files of
$GOROOT/src, BSD-3-Clause): no testdata/, no vendor/ (third-party code with
other licences), no generated files (tables that teach nothing). _test.go
files are kept (--no-tests drops them): they are ordinary Go and double the
data, and a 7M-parameter model trained for minutes on an H200 sees the
library-only sample (27 MB) about 20 times over. Files are ordered by the SHA-256 of their path;
the first ones (about --heldout-mb) are the held-out split, the rest training,
until --max-mb. Split is by file, so no held-out text is seen in training.

Writes under --out (default .gpu-demo/, gitignored):
  train.u16.xz    token ids (uint16 little-endian), files joined by <|endoftext|>
  heldout.u16.xz  same for the held-out files
  heldout.txt.xz  held-out text (files joined by NUL) for prompts
  meta.json       file lists, sizes, token counts, tokenizer hash

--train-tokenizer re-learns the BPE (test/demo/tokenizer/, committed) from
the first --bpe-mb of the training split before encoding.
"""

import argparse
import hashlib
import json
import lzma
import multiprocessing as mp
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demotok  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def collect(src, tests):
    files = []
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in ("testdata", "vendor") and not d.startswith((".", "_")))
        for n in sorted(names):
            if not n.endswith(".go") or (n.endswith("_test.go") and not tests):
                continue
            p = os.path.join(root, n)
            if os.path.getsize(p) > 200_000:
                continue
            with open(p, "rb") as f:
                b = f.read()
            head = b[:4096]
            if b"Code generated" in head and b"DO NOT EDIT" in head:
                continue
            try:
                text = b.decode("utf-8")
            except UnicodeDecodeError:
                continue
            rel = os.path.relpath(p, src)
            files.append((hashlib.sha256(rel.encode()).hexdigest(), rel, text))
    files.sort()
    return files


_tok = None


def _init(folder):
    global _tok
    _tok = demotok.Tokenizer.load(folder)


def _encode(text):
    return _tok.encode(text, specials=False)


def encode_files(folder, texts, eos, procs):
    with mp.Pool(procs, initializer=_init, initargs=(folder,)) as pool:
        out = []
        for ids in pool.imap(_encode, texts, chunksize=16):
            out.extend(ids)
            out.append(eos)
    return out


def write_u16(path, ids):
    data = struct.pack("<%dH" % len(ids), *ids)
    with lzma.open(path, "wb", preset=6) as f:
        f.write(data)
    return os.path.getsize(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=os.path.join(os.environ.get("GOROOT", "/usr/local/go"), "src"))
    ap.add_argument("--out", default=".gpu-demo")
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer"))
    ap.add_argument("--max-mb", type=float, default=40.0)
    ap.add_argument("--heldout-mb", type=float, default=0.5)
    ap.add_argument("--no-tests", action="store_true", help="leave out _test.go files")
    ap.add_argument("--train-tokenizer", action="store_true")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--bpe-mb", type=float, default=4.0)
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()

    t0 = time.time()
    files = collect(a.src, not a.no_tests)
    total = sum(len(t) for _, _, t in files)
    print("collected %d files, %.1f MB" % (len(files), total / 1e6), flush=True)
    held, train, size = [], [], 0
    for h, rel, text in files:
        if size >= a.max_mb * 1e6:
            break
        (held if size < a.heldout_mb * 1e6 else train).append((rel, text))
        size += len(text)
    print("held-out %d files %.2f MB, train %d files %.2f MB" % (
        len(held), sum(len(t) for _, t in held) / 1e6, len(train), sum(len(t) for _, t in train) / 1e6), flush=True)

    if a.train_tokenizer:
        sample, n = [], 0
        for _, text in train:
            if n >= a.bpe_mb * 1e6:
                break
            sample.append(text)
            n += len(text)
        merges = demotok.train_bpe(sample, a.vocab, log=lambda m: print(m, flush=True))
        demotok.write_tokenizer(a.tokenizer, merges)
        print("tokenizer: %d merges from %.1f MB -> %s (%.0fs)" % (len(merges), n / 1e6, a.tokenizer, time.time() - t0), flush=True)

    tok = demotok.Tokenizer.load(a.tokenizer)
    eos = tok.specials[demotok.EOS]
    os.makedirs(a.out, exist_ok=True)
    meta = {"source": a.src, "licence": "BSD-3-Clause (Go standard library)", "vocab": len(tok)}
    with open(os.path.join(a.tokenizer, "tokenizer.json"), "rb") as f:
        meta["tokenizer_sha256"] = hashlib.sha256(f.read()).hexdigest()
    for name, part in (("heldout", held), ("train", train)):
        texts = [t for _, t in part]
        ids = encode_files(a.tokenizer, texts, eos, a.procs)
        nb = write_u16(os.path.join(a.out, name + ".u16.xz"), ids)
        nbytes = sum(len(t.encode()) for t in texts)
        meta[name] = {"files": [r for r, _ in part], "bytes": nbytes, "tokens": len(ids),
                      "bytes_per_token": round(nbytes / len(ids), 3), "xz_bytes": nb}
        print("%s: %d tokens (%.2f bytes/token), %.1f MB xz (%.0fs)" % (
            name, len(ids), nbytes / len(ids), nb / 1e6, time.time() - t0), flush=True)
    with lzma.open(os.path.join(a.out, "heldout.txt.xz"), "wt", encoding="utf-8") as f:
        f.write("\0".join(t for _, t in held))
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("done in %.0fs" % (time.time() - t0))


if __name__ == "__main__":
    main()
