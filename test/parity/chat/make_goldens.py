#!/usr/bin/env python3
"""Render chat-template goldens for sdk/chat with Hugging Face transformers.

Every template named in templates.json is rendered for every conversation in
cases.json through transformers' own `apply_chat_template` (a
PreTrainedTokenizerFast built around a one-word vocabulary carries the template
and the special tokens, so no model download is needed). The result is one JSON
file per template, holding the inputs in sdk shapes plus the expected string
(or the error the template raised). sdk/chat's Go tests render the same inputs
and must match byte for byte.

Usage (transformers 5.17 lives on the GPU machine only):

    test/parity/chat/collect_templates.sh            # copies templates into test/parity/chat/templates/
    python3 test/parity/chat/make_goldens.py --out OUTDIR
    cp OUTDIR/*.json sdk/chat/testdata/goldens/

`--renderer jinja2` renders with a plain jinja2 environment configured the way
transformers configures it; it exists only to try the script where transformers
is missing, and its output is marked as such.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_arguments(text: str):
    """Tool-call arguments as templates see them: a mapping when the JSON text
    is an object (as HF-compatible servers pass them), else the raw string."""
    if text.strip() == "":
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def to_template_message(m: dict) -> dict:
    """sdk.Message JSON -> the dict a chat template reads. Must stay in step
    with messageValue in sdk/chat/template.go (same keys, same order)."""
    out = {"role": m["role"], "content": m.get("content", "")}
    if m.get("reasoning_content"):
        out["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": tc.get("id", ""),
                "type": "function",
                "function": {"name": tc["name"], "arguments": parse_arguments(tc.get("arguments", ""))},
            }
            for tc in m["tool_calls"]
        ]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    if m.get("name"):
        out["name"] = m["name"]
    return out


def to_template_tool(t: dict) -> dict:
    """sdk.Tool JSON -> OpenAI-style tool dict (what servers pass as `tools`)."""
    fn = {"name": t["name"]}
    if t.get("description"):
        fn["description"] = t["description"]
    if t.get("parameters") is not None:
        fn["parameters"] = t["parameters"]
    return {"type": "function", "function": fn}


class TransformersRenderer:
    def __init__(self):
        import transformers  # noqa: F401
        from tokenizers import Tokenizer, models

        self.transformers = transformers
        self.Tokenizer = Tokenizer
        self.models = models
        self.name = f"transformers {transformers.__version__} apply_chat_template"

    def render(self, source, bos, eos, messages, tools, agp, kwargs):
        from transformers import PreTrainedTokenizerFast

        core = self.Tokenizer(self.models.WordLevel(vocab={"<unk>": 0}, unk_token="<unk>"))
        special = {}
        if bos:
            special["bos_token"] = bos
        if eos:
            special["eos_token"] = eos
        tok = PreTrainedTokenizerFast(tokenizer_object=core, chat_template=source, **special)
        out = tok.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=agp, **kwargs
        )
        if not isinstance(out, str):
            raise TypeError(f"apply_chat_template returned {type(out).__name__}, want str")
        return out


class Jinja2Renderer:
    """transformers' environment rebuilt on plain jinja2 (trial runs only)."""

    def __init__(self):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            return datetime.now().strftime(fmt)

        class Generation(jinja2.ext.Extension):
            # transformers' AssistantTracker: {% generation %} renders its body.
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.Scope(body).set_lineno(lineno)

        self.env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation]
        )
        self.env.filters["tojson"] = tojson
        self.env.globals["raise_exception"] = raise_exception
        self.env.globals["strftime_now"] = strftime_now
        self.name = f"jinja2 {jinja2.__version__} (transformers-like environment; NOT authoritative)"

    def render(self, source, bos, eos, messages, tools, agp, kwargs):
        special = {}
        if bos:
            special["bos_token"] = bos
        if eos:
            special["eos_token"] = eos
        tmpl = self.env.from_string(source)
        return tmpl.render(
            messages=messages, tools=tools, documents=None, add_generation_prompt=agp, **special, **kwargs
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for <template>.json goldens")
    ap.add_argument("--templates-dir", default=str(HERE / "templates"), help="where collect_templates.sh put <name>.jinja")
    ap.add_argument("--renderer", choices=["transformers", "jinja2"], default="transformers")
    ap.add_argument("--manifest", default=str(HERE / "templates.json"), help="templates to render")
    ap.add_argument("--cases", default=str(HERE / "cases.json"), help="conversations to render")
    args = ap.parse_args()

    manifest = json.loads(Path(args.manifest).read_text(encoding="utf-8"))
    suite = json.loads(Path(args.cases).read_text(encoding="utf-8"))
    renderer = TransformersRenderer() if args.renderer == "transformers" else Jinja2Renderer()
    print(f"renderer: {renderer.name}", file=sys.stderr)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = 0
    for entry in manifest["templates"]:
        path = Path(args.templates_dir) / f"{entry['name']}.jinja"
        source = path.read_text(encoding="utf-8")
        bos, eos = entry.get("bos_token", ""), entry.get("eos_token", "")
        cases = []
        for case in suite["cases"]:
            tool_names = case.get("tools") or []
            sdk_tools = [suite["tools"][n] for n in tool_names]
            messages = [to_template_message(m) for m in case["messages"]]
            tools = [to_template_tool(t) for t in sdk_tools] or None
            kwargs = dict(case.get("extra") or {})
            if case.get("enable_thinking") is not None:
                kwargs["enable_thinking"] = case["enable_thinking"]
            record = {
                "name": case["name"],
                "messages": case["messages"],
                "tools": sdk_tools,
                "add_generation_prompt": case.get("add_generation_prompt", False),
                "enable_thinking": case.get("enable_thinking"),
                "extra": case.get("extra") or {},
            }
            try:
                record["expected"] = renderer.render(
                    source, bos, eos, messages, tools, record["add_generation_prompt"], kwargs
                )
            except Exception as exc:  # a template's raise_exception is a golden too
                if type(exc).__name__ not in ("TemplateError", "TemplateRuntimeError", "UndefinedError"):
                    print(f"{entry['name']}/{case['name']}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    failures += 1
                record["error"] = f"{type(exc).__name__}: {exc}"
            cases.append(record)
        golden = {
            "template": entry["name"],
            "family": entry["family"],
            "source": entry["source"],
            "template_sha256": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "renderer": renderer.name,
            "cases": cases,
        }
        dest = out_dir / f"{entry['name']}.json"
        dest.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {dest} ({len(cases)} cases, {sum('error' in c for c in cases)} errors)", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
