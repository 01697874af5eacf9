"""Byte-level BPE tokenizer for the demo model pair (pure Python stdlib).

The pre-tokenizer is Qwen2's split regex (the one sdk/tokenizer calls
"qwen2"), implemented by hand because Python's re has no \\p{L}; the byte
mapping is GPT-2's; merges are applied by rank as Hugging Face's BPE does.
Text is NFC-normalised first, as the written tokenizer.json says.
"""

import heapq
import json
import os
import unicodedata

# The split regex written into tokenizer.json; sdk/tokenizer recognises it
# as "qwen2". split() below is its hand-written equivalent.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
EOS = "<|endoftext|>"
MASK = "<|mask|>"

CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def byte_level():
    """GPT-2's byte -> printable character table."""
    table, n = [], 0
    for b in range(256):
        if ord('!') <= b <= ord('~') or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF:
            table.append(chr(b))
        else:
            table.append(chr(256 + n))
            n += 1
    return table


BYTE_CHARS = byte_level()


def _is_l(c):
    return c.isalpha()  # Unicode categories Lu Ll Lt Lm Lo = \p{L}


def _is_n(c):
    return unicodedata.category(c)[0] == "N"


def _is_s(c):
    return c.isspace()


def split(s):
    """Split s as the qwen2 regex does (leftmost-first, greedy)."""
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        # 1. contractions
        if c == "'" and i + 1 < n:
            d = s[i + 1].lower()
            if d in "stmd":
                out.append(s[i:i + 2]); i += 2; continue
            if i + 2 < n and (d + s[i + 2].lower()) in ("re", "ve", "ll"):
                out.append(s[i:i + 3]); i += 3; continue
        # 2. [^\r\n\p{L}\p{N}]?\p{L}+
        j = -1
        if _is_l(c):
            j = i
        elif c not in "\r\n" and not _is_n(c) and i + 1 < n and _is_l(s[i + 1]):
            j = i + 1
        if j >= 0:
            while j < n and _is_l(s[j]):
                j += 1
            out.append(s[i:j]); i = j; continue
        # 3. \p{N}
        if _is_n(c):
            out.append(c); i += 1; continue
        # 4.  ?[^\s\p{L}\p{N}]+[\r\n]*
        def punct(x):
            return not (_is_s(x) or _is_l(x) or _is_n(x))
        j = -1
        if punct(c):
            j = i
        elif c == " " and i + 1 < n and punct(s[i + 1]):
            j = i + 1
        if j >= 0:
            while j < n and punct(s[j]):
                j += 1
            while j < n and s[j] in "\r\n":
                j += 1
            out.append(s[i:j]); i = j; continue
        # 5-7. whitespace (c is whitespace here)
        k, last_nl = i, -1
        while k < n and _is_s(s[k]):
            if s[k] in "\r\n":
                last_nl = k
            k += 1
        if last_nl >= 0:
            j = last_nl + 1            # \s*[\r\n]+
        elif k == n:
            j = k                      # \s+(?!\S) at the end
        elif k - 1 > i:
            j = k - 1                  # \s+(?!\S): leave one for the next word
        else:
            j = k                      # \s+
        out.append(s[i:j]); i = j
    return out


def to_chars(piece):
    return "".join(BYTE_CHARS[b] for b in piece.encode("utf-8"))


def train_bpe(texts, vocab_size, log=None):
    """Learn merges so that 256 bytes + merges + SPECIALS = vocab_size."""
    n_merges = vocab_size - 256 - len(SPECIALS)
    counts = {}
    for t in texts:
        for p in split(unicodedata.normalize("NFC", t)):
            counts[p] = counts.get(p, 0) + 1
    sym_id = {c: i for i, c in enumerate(BYTE_CHARS)}
    syms = list(BYTE_CHARS)
    words, freqs = [], []
    for p, f in sorted(counts.items()):
        words.append([sym_id[c] for c in to_chars(p)])
        freqs.append(f)
    pair_count, where = {}, {}
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + freqs[wi]
            where.setdefault((a, b), set()).add(wi)
    heap = [(-c, syms[a], syms[b], a, b) for (a, b), c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        negc, _, _, a, b = heapq.heappop(heap)
        if pair_count.get((a, b), 0) != -negc or negc == 0:
            continue  # stale entry
        new = len(syms)
        syms.append(syms[a] + syms[b])
        sym_id[syms[new]] = new
        merges.append((syms[a], syms[b]))
        changed = set()
        for wi in sorted(where.pop((a, b), ())):
            w, f = words[wi], freqs[wi]
            if len(w) < 2:
                continue
            nw, k = [], 0
            while k < len(w):
                if k + 1 < len(w) and w[k] == a and w[k + 1] == b:
                    nw.append(new); k += 2
                else:
                    nw.append(w[k]); k += 1
            if len(nw) == len(w):
                continue
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                changed.add((x, y))
            for x, y in zip(nw, nw[1:]):
                pair_count[(x, y)] = pair_count.get((x, y), 0) + f
                where.setdefault((x, y), set()).add(wi)
                changed.add((x, y))
            words[wi] = nw
        pair_count.pop((a, b), None)
        for pr in changed:
            c = pair_count.get(pr, 0)
            if c > 0 and pr != (a, b):
                heapq.heappush(heap, (-c, syms[pr[0]], syms[pr[1]], pr[0], pr[1]))
        if log and len(merges) % 500 == 0:
            log("bpe: %d/%d merges" % (len(merges), n_merges))
    if len(merges) < n_merges:
        raise ValueError("corpus too small for %d merges (got %d)" % (n_merges, len(merges)))
    return merges


class Tokenizer:
    def __init__(self, vocab, merges, specials):
        self.vocab = vocab                      # token string -> id
        self.inv = {i: s for s, i in vocab.items()}
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.specials = specials                # special string -> id
        self.inv.update({i: s for s, i in specials.items()})
        self.byte_of = {c: b for b, c in enumerate(BYTE_CHARS)}
        self.cache = {}

    @classmethod
    def load(cls, folder):
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
        specials = {t["content"]: t["id"] for t in tj["added_tokens"]}
        return cls(tj["model"]["vocab"], merges, specials)

    def __len__(self):
        return len(self.vocab) + len(self.specials)

    def _bpe(self, piece):
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        parts = list(to_chars(piece))
        ranks = self.ranks
        while len(parts) > 1:
            best, bi = None, -1
            for k in range(len(parts) - 1):
                r = ranks.get((parts[k], parts[k + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, k
            if best is None:
                break
            a, b = parts[bi], parts[bi + 1]
            np_, k = [], 0
            while k < len(parts):
                if k + 1 < len(parts) and parts[k] == a and parts[k + 1] == b:
                    np_.append(a + b); k += 2
                else:
                    np_.append(parts[k]); k += 1
            parts = np_
        ids = [self.vocab[p] for p in parts]
        if len(self.cache) < 1_000_000:
            self.cache[piece] = ids
        return ids

    def encode(self, text, specials=True):
        """Encode text; special tokens written literally are recognised."""
        out = []
        if specials:
            # split on special tokens first, as HF's added-token matching does
            i = 0
            while True:
                best = None
                for s in self.specials:
                    k = text.find(s, i)
                    if k >= 0 and (best is None or k < best[0]):
                        best = (k, s)
                if best is None:
                    out.extend(self.encode(text[i:], specials=False))
                    return out
                out.extend(self.encode(text[i:best[0]], specials=False))
                out.append(self.specials[best[1]])
                i = best[0] + len(best[1])
        for p in split(unicodedata.normalize("NFC", text)):
            out.extend(self._bpe(p))
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            s = self.inv.get(int(i), "")
            if int(i) in self.specials.values():
                bs.extend(s.encode("utf-8"))
            else:
                bs.extend(self.byte_of[c] for c in s)
        return bs.decode("utf-8", errors="replace")


def write_tokenizer(folder, merges):
    """Write tokenizer.json + tokenizer_config.json; returns the Tokenizer."""
    os.makedirs(folder, exist_ok=True)
    vocab = {c: i for i, c in enumerate(BYTE_CHARS)}
    merge_list = []
    for a, b in merges:
        vocab[a + b] = len(vocab)
        merge_list.append(a + " " + b)
    specials = {}
    added = []
    for s in SPECIALS:
        specials[s] = len(vocab) + len(specials)
        added.append({"id": specials[s], "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": merge_list},
    }
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "model_max_length": 4096,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", MASK],
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
    return Tokenizer(vocab, merges, specials)
