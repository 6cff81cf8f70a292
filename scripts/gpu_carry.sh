#!/usr/bin/env bash
# What scripts/gpu_check.sh needs carried to the team's `device` machine (no network there), made
# here in one command: the wheels its image lacks (.whl), the demo tokenizer (.tok/tokenizer, for
# test_cuda_sampling.py and the serve stages) and, with a commit, that commit's engine as .old (the
# `oldnew`, `prefillab` and `profile*` stages' committed tree). Each folder is listed in
# .git/info/exclude so that it travels only when a call's `carry` names it:
#   bash scripts/gpu_carry.sh [COMMIT]
#   then run(..., carry=[".whl", ".tok", ".ficache", ".old"])   (.ficache: from a `savecache` stage)
# A warm device machine keeps its installed wheels: after changing .whl, start the call with
# `rm -f /tmp/minisgl-gpu-check/site/.done`.
set -euo pipefail
cd "$(dirname "$0")/.."
for folder in .whl .tok .old .ficache .pkgs; do
  grep -qx "/$folder/" .git/info/exclude 2>/dev/null || echo "/$folder/" >> .git/info/exclude
done
# pinned to what ran there (2026-12-04): FlashInfer and its FFI; the engine's own needs; xgrammar
# (structured output: without it test_cuda_sampling's grammar tests fail) and pydantic, which it needs;
# gguf (the demo stage converts the demo GGUF)
WHEELS=(flashinfer-python==0.6.6 apache-tvm-ffi==0.1.15.post2 msgspec==0.23.0 platformdirs==4.14.9 pyzmq==27.3.0
        setproctitle==1.3.8 xgrammar==0.2.9 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 gguf==0.19.0
        # the server (the serve stages and test_serve_on_cuda_answers_paris start `minisgl-chat serve`)
        fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 click==8.5.1
        prometheus_client==0.26.0 opentelemetry-api==1.45.3 annotated-doc==0.0.7 httpx==0.29.0 httpcore==1.0.9 certifi==2026.10.19.post1 idna==3.20)
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
echo "wheels: $(ls .whl | wc -l) files, $(du -sh .whl | cut -f1)"
# the demo tokenizer, from the demo model `minisgl-chat pull` put in the cache
demo="${MINISGL_CACHE_DIR:-$HOME/.cache/minisgl-chat}/models/smollm2-135m-instruct"
if [ -f "$demo/tokenizer.json" ]; then
  mkdir -p .tok/tokenizer
  cp "$demo"/{tokenizer.json,tokenizer_config.json,chat_template.jinja} .tok/tokenizer/
  echo "tokenizer: .tok/tokenizer"
else
  echo "no demo model at $demo: run \`minisgl-chat pull\` first for .tok (test_cuda_sampling.py skips without it)" >&2
fi
if [ $# -ge 1 ]; then
  rm -rf .old && mkdir .old
  git archive "$1" engine app | tar -x -C .old
  mv .old/engine .old/minisgl_engine && mv .old/app .old/minisgl_app
  echo ".old: $(git rev-parse --short "$1")"
fi
