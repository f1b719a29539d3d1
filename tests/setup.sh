#!/usr/bin/env bash
# Installs what building and testing need, only when missing: Debian packages (OpenBLAS, PCRE2,
# stb, jansson; chromium for the --kept-map page test; Slurm and munge for the array job test;
# zsh, fish and groff for the completion and man page checks) and the Python reference packages (numpy, gguf, tokenizers, pytest) into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
[ -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.a ] || need+=(libopenblas-openmp-dev)
[ -f /usr/lib/x86_64-linux-gnu/libpcre2-8.a ] || need+=(libpcre2-dev)
[ -f /usr/include/stb/stb_ds.h ] || need+=(libstb-dev)
[ -f /usr/lib/x86_64-linux-gnu/libjansson.a ] || need+=(libjansson-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v clang >/dev/null || need+=(clang)
command -v chromium >/dev/null || need+=(chromium)
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
command -v zsh >/dev/null || need+=(zsh)            # zsh -n on the generated completion
command -v groff >/dev/null || need+=(groff-base)   # the generated man page renders cleanly
command -v fish >/dev/null || need+=(fish)          # fish -n on the generated completion
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]}" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
fi
REQ=tests/requirements.txt
if [ ! -x .venv/bin/python ] || ! cmp -s "$REQ" .venv/requirements.txt; then
    echo "setup: creating .venv with $(tr '\n' ' ' < "$REQ")" >&2
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r "$REQ" >&2
    cp "$REQ" .venv/requirements.txt
fi
