// Package jinja is the subset of Jinja2 that model chat templates use,
// evaluated with Python's semantics so that output matches Hugging Face
// transformers' apply_chat_template byte for byte.
//
// It reproduces transformers' environment: trim_blocks and lstrip_blocks on,
// the loopcontrols extension, a no-op {% generation %} block, tojson as
// json.dumps(ensure_ascii=False), raise_exception and strftime_now, and the
// default Undefined (prints as "", fails on attribute access). Values follow
// Python: floats print like repr(), None prints "None", lists and dicts print
// like their repr, dicts keep insertion order, + on mismatched types fails.
package jinja
